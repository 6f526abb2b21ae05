import type { ChildProcess } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { checkNoLeaks, startCli, type CliProc, type LogLine } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { until } from '../test/support/poll.js';
import { forwarderRig, startRig, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { unlessMissing } from '../test/tools/prerequisite.js';
import { existingUser, killGroup, spawnAsAgent } from '../test/support/agent-user.js';
import { assertJsonError, parseResponse, RawConnection, type Resp } from './helpers/http-raw.js';

/*
 * SPEC / issue 5 item 3: with `--allowed-uids`, the peer UID of each accepted loopback
 * connection is asked of the kernel once per connection (docs/access.md); any other UID gets 403
 * `forbidden_peer` before any routing (the upstream is never called). We run as root (uid
 * 0); the other local user is `nobody` (65534), reached with setpriv.
 */

const NOBODY_UID = 65534;
const REFUSED_MSG = 'connection from a UID not allowed (agent users, --allowed-uids)';
const BINDING = 'bind_allowed_uids_01';
const isRoot = process.getuid?.() === 0;

/** Every test here needs root: to run a client as nobody (CI runs as root). */
const needsRoot = { skip: unlessMissing(t, isRoot ? undefined : 'needs root to run a client as nobody') };
function test(name: string, fn: (t: TapTest) => Promise<void>): void {
  t.test(name, needsRoot, fn);
}

/**
 * A raw HTTP client run as `nobody`: for each of `conns` connections, one after the other,
 * writes `request` (possibly several pipelined requests) and reads until the server closes.
 * Prints one JSON line per connection: the base64 of everything received.
 */
const NOBODY_CLIENT = `
const net = require('net');
const [port, b64, conns] = process.argv.slice(1);
const text = Buffer.from(b64, 'base64');
(async () => {
  for (let i = 0; i < Number(conns); i++) {
    const got = await new Promise((resolve) => {
      const chunks = [];
      const s = net.connect(Number(port), '127.0.0.1');
      const timer = setTimeout(() => { s.destroy(); resolve(Buffer.concat(chunks)); }, 8000);
      s.on('connect', () => s.write(text));
      s.on('data', (d) => chunks.push(d));
      s.on('error', () => undefined);
      s.on('close', () => { clearTimeout(timer); resolve(Buffer.concat(chunks)); });
    });
    process.stdout.write(JSON.stringify({ uid: process.getuid(), data: got.toString('base64') }) + '\\n');
  }
})();
`;

/**
 * `node -e <args[0]> args[1..]` as nobody, from `/` with a clean environment: the test's
 * directory and NODE_OPTIONS (tap's loaders) point into the checkout, which nobody cannot
 * enter when it is cloned somewhere private.
 */
function runAsNobody(args: string[]): ChildProcess {
  const child = spawnAsAgent(existingUser('nobody'), 'exec "$@"', { env: { PATH: '/usr/bin:/bin' }, args: [process.execPath, '-e', ...args] });
  child.stdin!.end();
  child.once('exit', () => killGroup(child));
  return child;
}

interface NobodyConnection {
  uid: number;
  responses: Resp[];
}

function asNobody(port: number, requestText: string, conns = 1): Promise<NobodyConnection[]> {
  return new Promise((resolve, reject) => {
    const child = runAsNobody([NOBODY_CLIENT, String(port), Buffer.from(requestText).toString('base64'), String(conns)]);
    let out = '';
    let err = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    child.once('error', reject);
    child.once('close', (code) => {
      if (code !== 0) {
        reject(new Error(`client as nobody exited ${code}: ${err}`));
        return;
      }
      const result: NobodyConnection[] = [];
      for (const l of out.split('\n').filter(Boolean)) {
        const { uid, data } = JSON.parse(l) as { uid: number; data: string };
        let buf: Buffer = Buffer.from(data, 'base64');
        const responses: Resp[] = [];
        for (;;) {
          const parsed = parseResponse(buf, true);
          if (!parsed || buf.length === 0) break;
          responses.push(parsed.resp);
          buf = parsed.rest;
          if (buf.length === 0) break;
        }
        result.push({ uid, responses });
      }
      resolve(result);
    });
  });
}

function httpRequest(method: string, path: string, port: number, body = '', close = false): string {
  return (
    `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\n` +
    `content-length: ${Buffer.byteLength(body)}\r\n${close ? 'connection: close\r\n' : ''}\r\n${body}`
  );
}

const PING = '{"jsonrpc":"2.0","id":1,"method":"ping"}';

function count(proc: CliProc, pred: (l: LogLine) => boolean, from = 0): number {
  return proc.since(from).filter(pred).length;
}

const isRefusal = (l: LogLine): boolean => l.msg === REFUSED_MSG;
const isAccess = (l: LogLine): boolean => l.msg === 'access';

async function gateway(tt: TapTest): Promise<MockGateway> {
  const gw = await MockGateway.start();
  tt.teardown(() => gw.close());
  gw.handle((_req, res) => json(res, 200, { jsonrpc: '2.0', id: 1, result: {} }));
  return gw;
}

/** A forwarder with one binding to `gw`; `url` is the binding's path. */
async function forwarder(tt: TapTest, gw: MockGateway, allowed: string, token: string, extra: string[] = []): Promise<ProxyProc & { url: string }> {
  const { fwd } = await forwarderRig(tt, { binding: BINDING, token, gw, args: ['--allowed-uids', allowed, ...extra] });
  return Object.assign(fwd, { url: `/i/${BINDING}/mcp` });
}

async function rootRequest(port: number, method: string, path: string, body = '', host = '127.0.0.1'): Promise<Resp> {
  const conn = await RawConnection.open(port, host);
  try {
    await conn.write(httpRequest(method, path, port, body, true).replace('127.0.0.1', host.includes(':') ? `[${host}]` : host));
    return await conn.readResponse();
  } finally {
    conn.destroy();
  }
}

test('forwarder --allowed-uids 0: root is served; nobody gets 403 forbidden_peer and the upstream is never called', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-A1');

  const ok = await rootRequest(fwd.port, 'POST', fwd.url, PING);
  t.equal(ok.status, 200, 'root (uid 0) is allowed');
  t.equal(gw.requests.length, 1, 'root reached the upstream');
  t.equal(gw.requests[0]?.headers.authorization, 'Bearer tok-allowed-uids-fwd-A1');
  t.equal(count(fwd, isRefusal), 0, 'no refusal logged for root');

  const mark = fwd.logs.length;
  const [conn] = await asNobody(fwd.port, httpRequest('POST', fwd.url, fwd.port, PING));
  t.equal(conn?.uid, NOBODY_UID, 'the client really ran as nobody');
  const resp = conn?.responses[0];
  t.ok(resp, 'nobody got an answer');
  if (!resp) return;
  assertJsonError(t, resp, 403, 'forbidden_peer', 'nobody');
  t.match(resp.headers.connection ?? '', /close/i, 'the refused connection is closed');
  t.equal(gw.requests.length, 1, 'the upstream was not called for nobody');

  const refusal = await fwd.waitForLog((l) => fwd.logs.indexOf(l) >= mark && isRefusal(l));
  t.equal(refusal.uid, NOBODY_UID, 'the refusal names the peer uid');
  t.equal(refusal.level, 'warn');
  const access = await fwd.waitForLog((l) => isAccess(l) && l.outcome === 'forbidden_peer');
  t.equal(access.status, 403, 'the access log records the 403');
});

test('forwarder: refusal comes before any routing (healthz, unknown binding, bad Host all 403 forbidden_peer for nobody)', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-B2');
  for (const [what, req] of [
    ['healthz', httpRequest('GET', '/healthz', fwd.port)],
    ['unknown binding', httpRequest('POST', '/i/bind_does_not_exist/mcp', fwd.port, PING)],
    ['unknown path', httpRequest('GET', '/nope', fwd.port)],
    ['hostile Host', httpRequest('POST', fwd.url, fwd.port, PING).replace(`Host: 127.0.0.1:${fwd.port}`, 'Host: evil.example')],
  ] as const) {
    const [conn] = await asNobody(fwd.port, req);
    const resp = conn?.responses[0];
    t.ok(resp, `${what}: answered`);
    if (resp) assertJsonError(t, resp, 403, 'forbidden_peer', what);
  }
  t.equal(gw.requests.length, 0, 'the upstream was never called');
  const health = await rootRequest(fwd.port, 'GET', '/healthz');
  t.equal(health.status, 200, 'root still gets /healthz');
});

test('forwarder: the refusal is logged once per refused connection, not per request', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-C3');

  // Three separate connections, one request each: three refusals.
  let mark = fwd.logs.length;
  const three = await asNobody(fwd.port, httpRequest('POST', fwd.url, fwd.port, PING), 3);
  t.equal(three.length, 3);
  for (const c of three) t.equal(c.responses[0]?.status, 403, 'each connection refused');
  await until(() => count(fwd, isRefusal, mark) >= 3 && count(fwd, isAccess, mark) >= 3, 'three refusals logged');
  await new Promise((r) => setTimeout(r, 200));
  t.equal(count(fwd, isRefusal, mark), 3, 'three connections → exactly three refusal lines');

  // One connection carrying three pipelined requests: one refusal line.
  mark = fwd.logs.length;
  const pipelined = httpRequest('POST', fwd.url, fwd.port, PING) + httpRequest('POST', fwd.url, fwd.port, PING) + httpRequest('POST', fwd.url, fwd.port, PING, true);
  const [one] = await asNobody(fwd.port, pipelined);
  t.ok((one?.responses.length ?? 0) >= 1, 'at least one answer');
  for (const r of one?.responses ?? []) t.equal(r.status, 403, 'every answer on it is 403');
  await until(() => count(fwd, isRefusal, mark) >= 1 && count(fwd, isAccess, mark) >= 1, 'the refusal logged');
  await new Promise((r) => setTimeout(r, 200));
  t.equal(count(fwd, isRefusal, mark), 1, 'one connection → exactly one refusal line, however many requests');
  t.equal(gw.requests.length, 0, 'the upstream was never called');
});

/** The forwarder's sock_diag helper: its `perl` child (a process this test started, through the forwarder). */
function helperPidOf(parent: number): number {
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const stat = (() => {
      try {
        return readFileSync(`/proc/${name}/stat`, 'latin1');
      } catch {
        return '';
      }
    })();
    // pid (comm) state ppid …: comm may hold spaces, so split after its closing paren.
    const m = /^\d+ \((.*)\) \S+ (\d+)/.exec(stat);
    if (m?.[1] === 'perl' && Number(m[2]) === parent) return Number(name);
  }
  throw new Error(`no perl child of ${parent}`);
}

/** One connection sending `text`, resolved with all it received once the server closed it. */
function oneShot(port: number, text: string): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const s = connect(port, '127.0.0.1');
    s.on('connect', () => s.write(text));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('error', () => undefined);
    s.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
  });
}

test('forwarder: a stopped peer-check helper and a flood of connections: past 1024 queued questions, connections are refused at once (403), logged once', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-K1');
  const pid = helperPidOf(fwd.child.pid ?? -1);
  process.kill(pid, 'SIGSTOP');
  t.teardown(() => {
    try {
      process.kill(pid, 'SIGCONT');
    } catch {
      // gone with the forwarder
    }
  });
  const CAP = 1024;
  const EXTRA = 48;
  const health = httpRequest('GET', '/healthz', fwd.port, '', true);
  const mark = fwd.logs.length;
  let answered = 0;
  const arrivals = new EventEmitter();
  const all = Array.from({ length: CAP + EXTRA }, () =>
    oneShot(fwd.port, health).then((text) => {
      answered += 1;
      arrivals.emit('answer');
      return text;
    }),
  );
  // While the helper cannot run, only the cap can answer: exactly the connections past it.
  while (answered < EXTRA) await once(arrivals, 'answer');
  const overloaded = await fwd.waitForLog((l) => typeof l.msg === 'string' && l.msg.startsWith('peer check overloaded'), 10_000, mark);
  t.equal(overloaded.level, 'warn');
  t.equal(overloaded.outstanding, CAP);
  process.kill(pid, 'SIGCONT');
  const texts = await Promise.all(all);
  const statuses = texts.map((x) => /^HTTP\/1\.1 (\d{3})/.exec(x)?.[1] ?? 'none');
  t.equal(statuses.filter((x) => x === '403').length, EXTRA, `${EXTRA} refused at the cap`);
  t.ok(texts.filter((x) => x.startsWith('HTTP/1.1 403')).every((x) => x.includes('"forbidden_peer"')), 'each a 403 forbidden_peer');
  t.equal(statuses.filter((x) => x === '200').length, CAP, 'the queued ones are checked and served once the helper runs again');
  const recovered = await fwd.waitForLog((l) => l.msg === 'peer check caught up; connections are checked again', 10_000, mark);
  t.equal(recovered.refused, EXTRA);
  t.equal(count(fwd, (l) => typeof l.msg === 'string' && l.msg.startsWith('peer check overloaded'), mark), 1, 'the episode warned once');
  t.equal(count(fwd, isRefusal, mark), 0, 'no per-connection refusal line for the overload refusals');
  t.equal(gw.requests.length, 0, 'the upstream was never called');
});

test('forwarder: a keep-alive connection from an allowed uid serves several requests, all in the access log', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-D4');
  const mark = fwd.logs.length;
  const conn = await RawConnection.open(fwd.port);
  t.teardown(() => conn.destroy());
  const N = 5;
  for (let i = 0; i < N; i++) {
    await conn.write(httpRequest('POST', fwd.url, fwd.port, PING));
    const r = await conn.readResponse();
    t.equal(r.status, 200, `request ${i + 1} on the same connection served`);
  }
  t.notOk(conn.closed, 'the connection stayed open');
  t.equal(gw.requests.length, N, 'every request reached the upstream');
  await until(() => count(fwd, isAccess, mark) >= N, `${N} access lines`);
  const access = fwd.since(mark).filter(isAccess);
  t.equal(access.length, N, `${N} access lines`);
  t.ok(access.every((l) => l.status === 200 && l.outcome === 'ok'), 'all served (200, ok)');
  t.equal(count(fwd, isRefusal, mark), 0, 'no refusal');

  // The same from nobody with --allowed-uids 0,nobody: several requests on one connection.
  const fwd2 = await forwarder(t, gw, '0,nobody', 'tok-allowed-uids-fwd-D5');
  const mark2 = fwd2.logs.length;
  const before = gw.requests.length;
  const pipelined = httpRequest('POST', fwd2.url, fwd2.port, PING) + httpRequest('POST', fwd2.url, fwd2.port, PING) + httpRequest('POST', fwd2.url, fwd2.port, PING, true);
  const [c] = await asNobody(fwd2.port, pipelined);
  t.equal(c?.responses.length, 3, 'three answers on one connection');
  t.ok(c?.responses.every((r) => r.status === 200), 'all 200');
  t.equal(gw.requests.length, before + 3, 'all three reached the upstream');
  await until(() => count(fwd2, isAccess, mark2) >= 3, 'three access lines');
  t.ok(fwd2.since(mark2).filter(isAccess).every((l) => l.status === 200), 'all served in the access log');
  t.equal(count(fwd2, isRefusal, mark2), 0, 'no refusal');
});

test('forwarder --allowed-uids 0,nobody (a name): nobody is allowed and reaches the upstream with the file token', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0,nobody', 'tok-allowed-uids-fwd-E5');
  const [conn] = await asNobody(fwd.port, httpRequest('POST', fwd.url, fwd.port, PING, true));
  t.equal(conn?.uid, NOBODY_UID);
  t.equal(conn?.responses[0]?.status, 200, 'nobody served');
  t.equal(gw.requests.length, 1, 'the upstream was called');
  t.equal(gw.requests[0]?.headers.authorization, 'Bearer tok-allowed-uids-fwd-E5');
  t.equal((await rootRequest(fwd.port, 'POST', fwd.url, PING)).status, 200, 'root still served');
  t.equal(count(fwd, isRefusal), 0, 'no refusal at all');
});

test('forwarder --allowed-uids 65534 (nobody only): root is refused', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, String(NOBODY_UID), 'tok-allowed-uids-fwd-F6');
  const r = await rootRequest(fwd.port, 'POST', fwd.url, PING);
  assertJsonError(t, r, 403, 'forbidden_peer', 'root');
  t.equal(gw.requests.length, 0, 'the upstream was not called');
  const refusal = await fwd.waitForLog(isRefusal);
  t.equal(refusal.uid, 0);
  const [conn] = await asNobody(fwd.port, httpRequest('POST', fwd.url, fwd.port, PING, true));
  t.equal(conn?.responses[0]?.status, 200, 'nobody served');
});

test('forwarder on [::1] with --allowed-uids 0: root served, nobody refused', async (t) => {
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-G7', ['--listen', '[::1]:0']);
  const ok = await rootRequest(fwd.port, 'POST', fwd.url, PING, '::1');
  t.equal(ok.status, 200, 'root over ::1');
  const script = NOBODY_CLIENT.replace("'127.0.0.1'", "'::1'");
  const res = await new Promise<string>((resolve, reject) => {
    const child = runAsNobody([script, String(fwd.port), Buffer.from(httpRequest('POST', fwd.url, fwd.port, PING).replace(`127.0.0.1:${fwd.port}`, `[::1]:${fwd.port}`)).toString('base64'), '1']);
    let out = '';
    let err = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`client as nobody exited ${code}: ${err}`))));
  });
  const data = Buffer.from((JSON.parse(res.trim()) as { data: string }).data, 'base64');
  const parsed = parseResponse(data, true);
  t.ok(parsed, 'nobody got an answer over ::1');
  if (parsed) assertJsonError(t, parsed.resp, 403, 'forbidden_peer', 'nobody over ::1');
  t.equal(gw.requests.length, 1, 'only root reached the upstream');
});

test('forwarder on [::ffff:127.0.0.1] (an accepted loopback listen address) with --allowed-uids 0: root via 127.0.0.1 is served', async (t) => {
  // parseListen accepts the IPv4-mapped loopback; a plain 127.0.0.1 client then shows up
  // as ::ffff:127.0.0.1 on the server while the kernel lists it in /proc/net/tcp.
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-H8', ['--listen', '[::ffff:127.0.0.1]:0']);
  const r = await rootRequest(fwd.port, 'POST', fwd.url, PING);
  t.equal(r.status, 200, `root is served (got ${r.status} ${r.body})`);
  t.equal(count(fwd, isRefusal), 0, 'root is not logged as refused');
});

test('forwarder on 127.0.0.1 (the default family) with --allowed-uids 0: a dual-stack client (AF_INET6 socket to ::ffff:127.0.0.1, as a JVM makes) is served', async (t) => {
  // The server sees plain 127.0.0.1; the kernel lists the client socket in /proc/net/tcp6
  // with v4-mapped addresses.
  const gw = await gateway(t);
  const fwd = await forwarder(t, gw, '0', 'tok-allowed-uids-fwd-I9');
  const conn = await RawConnection.open(fwd.port, '::ffff:127.0.0.1');
  t.teardown(() => conn.destroy());
  await conn.write(httpRequest('POST', fwd.url, fwd.port, PING, true));
  const r = await conn.readResponse();
  t.equal(r.status, 200, `root is served (got ${r.status} ${r.body})`);
  t.equal(count(fwd, isRefusal), 0, 'root is not logged as refused');
});

test('--allowed-uids with an unknown user name: forwarder and cli-proxy exit 2 at start, naming it', async (t) => {
  for (const part of ['forwarder', 'cli-proxy']) {
    for (const value of ['no-such-user', '0,no-such-user']) {
      const proc = startCli([part, '--listen', '127.0.0.1:0', '--state-dir', tempDir('ac-test-', t), '--allowed-uids', value]);
      t.teardown(() => proc.stop('SIGKILL'));
      const { code } = await proc.exited;
      t.equal(code, 2, `${part} --allowed-uids ${value}: exits 2`);
      t.match(proc.stderr.join('\n'), /no such user "no-such-user"/, `${part}: names the unknown user`);
      t.equal(count(proc, (l) => typeof l.msg === 'string' && l.msg.endsWith('listening')), 0, `${part}: never listened`);
    }
  }
});

// ---------------------------------------------------------------------------------------
// cli-proxy

async function cliProxy(tt: TapTest, gw: MockGateway, allowed: string, token: string): Promise<ProxyProc> {
  const { proc } = await startRig(tt, 'cli-proxy', {
    upstream: gw,
    args: ['--allowed-uids', allowed],
    tokens: { 'notion.token': token },
    config: (up, dir) => ({
      notion: { upstream: up.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: { type: 'header', name: 'X-Api-Key', value: 'Key {token}' } },
    }),
  });
  tt.ok(proc.port > 0, 'cli-proxy listening with its port');
  return proc;
}

test('cli-proxy --allowed-uids 0: root is served; nobody gets 403 forbidden_peer, upstream never called', async (t) => {
  const gw = await gateway(t);
  const proxy = await cliProxy(t, gw, '0', 'tok-allowed-uids-cli-A1');
  const ok = await rootRequest(proxy.port, 'GET', '/p/notion/users');
  t.equal(ok.status, 200, 'root served');
  t.equal(gw.requests.length, 1);
  t.equal(gw.requests[0]?.headers['x-api-key'], 'Key tok-allowed-uids-cli-A1');

  const mark = proxy.logs.length;
  const [conn] = await asNobody(proxy.port, httpRequest('GET', '/p/notion/users', proxy.port));
  t.equal(conn?.uid, NOBODY_UID);
  const resp = conn?.responses[0];
  t.ok(resp, 'nobody got an answer');
  if (resp) assertJsonError(t, resp, 403, 'forbidden_peer', 'nobody');
  const health = (await asNobody(proxy.port, httpRequest('GET', '/healthz', proxy.port)))[0]?.responses[0];
  if (health) assertJsonError(t, health, 403, 'forbidden_peer', 'nobody on /healthz');
  t.equal(gw.requests.length, 1, 'the upstream was not called for nobody');
  await until(() => count(proxy, isRefusal, mark) >= 2, 'two refusals');
  await new Promise((r) => setTimeout(r, 200));
  t.equal(count(proxy, isRefusal, mark), 2, 'two connections → two refusal lines');
  t.ok(proxy.since(mark).filter(isRefusal).every((l) => l.uid === NOBODY_UID), 'each names uid 65534');
});

test('cli-proxy: one refusal line per connection with pipelined requests; keep-alive root connection serves all', async (t) => {
  const gw = await gateway(t);
  const proxy = await cliProxy(t, gw, '0', 'tok-allowed-uids-cli-B2');
  let mark = proxy.logs.length;
  const req = httpRequest('GET', '/p/notion/users', proxy.port);
  const [one] = await asNobody(proxy.port, req + req + httpRequest('GET', '/p/notion/users', proxy.port, '', true));
  t.ok((one?.responses.length ?? 0) >= 1, 'answered');
  t.ok(one?.responses.every((r) => r.status === 403), 'every answer 403');
  await until(() => count(proxy, isRefusal, mark) >= 1 && count(proxy, isAccess, mark) >= 1, 'refusal logged');
  await new Promise((r) => setTimeout(r, 200));
  t.equal(count(proxy, isRefusal, mark), 1, 'exactly one refusal line');
  t.equal(gw.requests.length, 0, 'upstream never called');

  mark = proxy.logs.length;
  const conn = await RawConnection.open(proxy.port);
  t.teardown(() => conn.destroy());
  const N = 4;
  for (let i = 0; i < N; i++) {
    await conn.write(req);
    t.equal((await conn.readResponse()).status, 200, `request ${i + 1} served`);
  }
  t.notOk(conn.closed, 'still the same open connection');
  await until(() => count(proxy, isAccess, mark) >= N, 'access lines');
  t.equal(proxy.since(mark).filter(isAccess).filter((l) => l.status === 200).length, N, `${N} served in the access log`);
  t.equal(count(proxy, isRefusal, mark), 0, 'no refusal');
});

test('cli-proxy --allowed-uids 0,nobody: nobody is served', async (t) => {
  const gw = await gateway(t);
  const proxy = await cliProxy(t, gw, '0,nobody', 'tok-allowed-uids-cli-C3');
  const [conn] = await asNobody(proxy.port, httpRequest('GET', '/p/notion/users', proxy.port, '', true));
  t.equal(conn?.responses[0]?.status, 200, 'nobody served');
  t.equal(gw.requests.length, 1);
  t.equal(gw.requests[0]?.headers['x-api-key'], 'Key tok-allowed-uids-cli-C3');
  t.equal(count(proxy, isRefusal), 0);
});

if (isRoot) checkNoLeaks(t);
