import { connect } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, writeToken } from '../test/support/cli-proc.js';
import { MockGateway, json, sse, type SeenRequest } from '../test/support/mock-gateway.js';
import { deferred, until, within } from '../test/support/poll.js';
import { loadConfig, partDir, startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { StreamReader } from './helpers/sse-client.js';
import { notifyReceiverMissing, startNotifyReceiver, systemdNotifyMissing, type NotifyDatagram } from '../test/tools/notify-receiver.js';
import { unlessMissing } from '../test/tools/prerequisite.js';

const BINDING_A = 'bind_process_aaaa01';
const BINDING_B = 'bind_process_bbbb02';

const is = (assignment: string) => (d: NotifyDatagram): boolean => d.assignments.includes(assignment);

t.test('sd_notify against a real unix datagram NOTIFY_SOCKET', { skip: unlessMissing(t, notifyReceiverMissing() ?? systemdNotifyMissing()) }, async (t) => {
  const stateDir = tempDir();
  const tokenFile = join(partDir(stateDir, 'forwarder'), 'inst-notify.token');
  writeToken(tokenFile, 'tok-notify-Qz81-xv');
  const recv = await startNotifyReceiver(t);

  const fwd = await startProxy(t, 'forwarder', {
    stateDir,
    config: {
      [BINDING_A]: { instanceId: 'inst-notify', upstreamUrl: 'http://127.0.0.1:9/mcp', tokenFile },
      [BINDING_B]: { instanceId: 'inst-notify', upstreamUrl: 'http://127.0.0.1:9/mcp', tokenFile },
    },
    env: { NOTIFY_SOCKET: recv.socketPath, WATCHDOG_USEC: '400000', WATCHDOG_PID: undefined },
  });

  const ready = await recv.waitFor(is('READY=1'), 0, 'READY=1');
  const readyMsg = recv.datagrams[ready] as NotifyDatagram;
  const status = readyMsg.assignments.find((a) => a.startsWith('STATUS='));
  t.ok(status, 'READY=1 comes with a STATUS=');
  t.match(status, /\b2\b/, 'STATUS= names the instance count (2)');

  const wd1 = await recv.waitFor(is('WATCHDOG=1'), ready + 1, 'a first WATCHDOG=1 after READY=1');
  const wd2 = await recv.waitFor(is('WATCHDOG=1'), wd1 + 1, 'a second WATCHDOG=1');
  t.ok(ready < wd1 && wd1 < wd2, 'READY=1, then WATCHDOG=1 pings (at least two)');

  const beforeHup = recv.datagrams.length;
  const hupAtUsec = process.hrtime.bigint() / 1000n;
  fwd.child.kill('SIGHUP');
  const reloading = await recv.waitFor(is('RELOADING=1'), beforeHup, 'RELOADING=1 after SIGHUP');
  const mono = (recv.datagrams[reloading] as NotifyDatagram).assignments.find((a) => a.startsWith('MONOTONIC_USEC='));
  t.ok(mono, 'RELOADING=1 carries MONOTONIC_USEC=');
  const monoUsec = BigInt(mono?.slice('MONOTONIC_USEC='.length).match(/^\d+$/)?.[0] ?? '0');
  const skewS = Number(monoUsec > hupAtUsec ? monoUsec - hupAtUsec : hupAtUsec - monoUsec) / 1e6;
  t.ok(skewS < 60, `MONOTONIC_USEC is CLOCK_MONOTONIC in µs (off from ours by ${skewS.toFixed(3)} s)`);
  const readyAgain = await recv.waitFor(is('READY=1'), reloading + 1, 'READY=1 after RELOADING=1');
  t.ok(reloading < readyAgain, 'RELOADING=1 then READY=1 around the reload');
  t.match((recv.datagrams[readyAgain] as NotifyDatagram).assignments.find((a) => a.startsWith('STATUS=')), /\b2\b/);

  const wd3 = await recv.waitFor(is('WATCHDOG=1'), readyAgain + 1, 'WATCHDOG=1 pings to go on after the reload');
  t.ok(readyAgain < wd3, 'the watchdog keeps pinging after the reload');

  const beforeTerm = recv.datagrams.length;
  fwd.child.kill('SIGTERM');
  const stopping = await recv.waitFor(is('STOPPING=1'), beforeTerm, 'STOPPING=1 after SIGTERM');
  t.ok(readyAgain < stopping, 'STOPPING=1 comes last');
  const exit = await within(fwd.exited, 15_000, 'the forwarder to exit');
  t.same(exit, { code: 0, signal: null }, 'exit 0 after SIGTERM');
  t.same(
    fwd.logs.filter((l) => l.msg === 'sd_notify failed'),
    [],
    'no sd_notify call failed',
  );
});

t.test('without NOTIFY_SOCKET nothing fails', async (t) => {
  const gw = await MockGateway.start();
  t.teardown(() => gw.close());
  const fwd = await startProxy(t, 'forwarder', { env: { NOTIFY_SOCKET: undefined, WATCHDOG_USEC: '400000', WATCHDOG_PID: undefined } });
  const tokenFile = join(fwd.stateDir, 'mcp-forwarder', 'inst-plain.token');
  writeToken(tokenFile, 'tok-no-notify-44Lm');
  await loadConfig(fwd, { [BINDING_A]: { instanceId: 'inst-plain', upstreamUrl: gw.url(), tokenFile } });

  const health = await request(`${fwd.base}/healthz`);
  t.equal(health.statusCode, 200);
  t.match(await health.body.json(), { status: 'ok', instances: 1 });
  const res = await request(`${fwd.base}/i/${BINDING_A}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
  await res.body.dump();
  t.equal(res.statusCode, 200, 'a request is forwarded');

  const before = fwd.logs.length;
  fwd.child.kill('SIGHUP');
  await fwd.waitForLog((l) => fwd.logs.indexOf(l) >= before && l.msg === 'registry loaded');
  const again = await request(`${fwd.base}/healthz`);
  t.equal(again.statusCode, 200, 'still serving after SIGHUP');
  await again.body.dump();

  const exit = await within(fwd.stop('SIGTERM'), 15_000, 'the forwarder to exit');
  t.same(exit, { code: 0, signal: null }, 'exit 0');
  t.same(
    fwd.logs.filter((l) => l.level === 'warn' || l.level === 'error' || l.level === 'fatal'),
    [],
    'no warning or error was logged',
  );
});

/** Tries a fresh TCP connection: 'refused' once nobody listens any more. */
function tryConnect(port: number): Promise<'connected' | 'refused' | 'other'> {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1');
    sock.once('connect', () => {
      sock.destroy();
      resolve('connected');
    });
    sock.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED' ? 'refused' : 'other'));
  });
}

async function withBinding(t: TapTest, fwd: ProxyProc, gw: MockGateway, token: string): Promise<string> {
  const tokenFile = join(fwd.stateDir, 'mcp-forwarder', 'inst-term.token');
  writeToken(tokenFile, token);
  await loadConfig(fwd, { [BINDING_A]: { instanceId: 'inst-term', upstreamUrl: gw.url(), tokenFile } });
  t.pass('binding loaded');
  return `${fwd.base}/i/${BINDING_A}/mcp`;
}

t.test('SIGTERM: the in-flight request finishes, new connections are refused, exit 0', async (t) => {
  const gw = await MockGateway.start();
  t.teardown(() => gw.close());
  const fwd = await startProxy(t, 'forwarder');
  const url = await withBinding(t, fwd, gw, 'tok-sigterm-drain-71Qa');
  const release = deferred();
  const answer = { jsonrpc: '2.0', id: 3, result: { content: [{ type: 'text', text: 'slow but done' }] } };
  gw.handle(async (_req, res) => {
    await release.promise;
    json(res, 200, answer);
  });

  let settled = false;
  const inflight = request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"jsonrpc":"2.0","id":3,"method":"tools/call"}' });
  void inflight.then(
    () => (settled = true),
    () => (settled = true),
  );
  const seen: SeenRequest = await gw.waitForRequests(1);

  fwd.child.kill('SIGTERM');
  await until(async () => (await tryConnect(fwd.port)) === 'refused', 'new connections to be refused');
  t.pass('a new connection is refused while the request is in flight');
  t.notOk(settled, 'the in-flight request is still open (its upstream has not answered yet)');
  t.equal(fwd.child.exitCode, null, 'the process waits for it');

  release.resolve();
  const res = await within(inflight, 10_000, 'the in-flight response');
  t.equal(res.statusCode, 200, 'the in-flight request completes with 200');
  t.equal(await res.body.text(), JSON.stringify(answer), 'and its whole body');
  t.notOk(seen.wasAborted(), 'the upstream request was not aborted');
  const exit = await within(fwd.exited, 15_000, 'the forwarder to exit');
  t.same(exit, { code: 0, signal: null }, 'exit 0');
});

t.test('SIGTERM with --shutdown-grace-ms 500: an endless SSE stream is cut, the upstream sees the abort, exit 0', async (t) => {
  const gw = await MockGateway.start();
  t.teardown(() => gw.close());
  const fwd = await startProxy(t, 'forwarder', { args: ['--shutdown-grace-ms', '500'] });
  const url = await withBinding(t, fwd, gw, 'tok-sigterm-grace-93Zk');
  const opened = deferred<{ send: (data: string) => void; seen: SeenRequest }>();
  gw.handle((seen, res) => {
    const s = sse(res);
    opened.resolve({ send: s.send, seen });
  });

  const res = await request(url, {
    method: 'GET',
    headers: { accept: 'text/event-stream', 'mcp-session-id': 'sess-endless' },
  });
  t.equal(res.statusCode, 200);
  const up = await opened.promise;
  const reader = new StreamReader(res.body);
  up.send('data: before-shutdown\n\n');
  await reader.waitForText('before-shutdown');

  fwd.child.kill('SIGTERM');
  const end = await within(reader.ended, 15_000, 'the agent stream to be cut');
  t.pass(`the agent sees the stream close (${end.kind === 'end' ? 'clean end' : 'cut'})`);
  t.equal(reader.text(), 'data: before-shutdown\n\n', 'what was sent before is intact');
  await within(up.seen.aborted, 10_000, 'the upstream to see the abort');
  t.ok(up.seen.wasAborted(), 'the upstream request was aborted');
  const exit = await within(fwd.exited, 15_000, 'the forwarder to exit');
  t.same(exit, { code: 0, signal: null }, 'exit 0');
});

t.test('SIGTERM: the standalone GET stream is cut at once, while an in-flight POST still finishes', async (t) => {
  const gw = await MockGateway.start();
  t.teardown(() => gw.close());
  const fwd = await startProxy(t, 'forwarder'); // the default 10 s grace
  const url = await withBinding(t, fwd, gw, 'tok-sigterm-stream-44Lp');
  const opened = deferred<{ send: (data: string) => void; seen: SeenRequest }>();
  const release = deferred();
  const answer = { jsonrpc: '2.0', id: 9, result: { content: [{ type: 'text', text: 'finished during shutdown' }] } };
  gw.handle(async (seen, res) => {
    if (seen.method === 'GET') {
      const s = sse(res);
      opened.resolve({ send: s.send, seen });
      return;
    }
    await release.promise;
    json(res, 200, answer);
  });

  const stream = await request(url, { method: 'GET', headers: { accept: 'text/event-stream', 'mcp-session-id': 'sess-standalone' } });
  t.equal(stream.statusCode, 200);
  const up = await opened.promise;
  const reader = new StreamReader(stream.body);
  up.send('data: notification\n\n');
  await reader.waitForText('notification');

  let postSettled = false;
  const post = request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"jsonrpc":"2.0","id":9,"method":"tools/call"}' });
  void post.then(
    () => (postSettled = true),
    () => (postSettled = true),
  );
  await gw.waitForRequests(2);

  fwd.child.kill('SIGTERM');
  await within(reader.ended, 8_000, 'the GET stream to be cut before the grace period ends');
  t.notOk(postSettled, 'the GET stream was cut while the POST was still in flight');
  await within(up.seen.aborted, 8_000, 'the upstream GET to see the abort');
  t.ok(up.seen.wasAborted(), 'the upstream stream was closed too');
  t.equal(fwd.child.exitCode, null, 'the process still waits for the POST');

  release.resolve();
  const res = await within(post, 10_000, 'the in-flight POST');
  t.equal(res.statusCode, 200, 'the POST completes with 200');
  t.equal(await res.body.text(), JSON.stringify(answer), 'and its whole body');
  const stopped = await fwd.waitForLog((l) => l.msg === 'forwarder stopped');
  t.equal(stopped.clean, true, 'a clean stop: nothing had to be cut at the deadline');
  t.equal(stopped.streamsCut, 1, 'one open-ended stream cut');
  const exit = await within(fwd.exited, 15_000, 'the forwarder to exit');
  t.same(exit, { code: 0, signal: null }, 'exit 0');
});

checkNoLeaks(t);
