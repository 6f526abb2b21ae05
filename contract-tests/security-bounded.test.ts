import { spawn } from 'node:child_process';
import t from 'tap';
import { CLI } from '../test/support/cli-proc.js';
import { LoopbackServer } from '../test/support/loopback-server.js';
import { until, within } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { hostWorld } from './helpers/host-link-rig.js';

/**
 * Issue 21, item 4: every read is bounded. An agent squatting a stopped part's port and
 * streaming an endless `/healthz` drove the link to 8.3 GB and its presence never went
 * out (undici's body timeout is per pause, and a stream never pauses). The link, doctor
 * and status must cut such an answer off, call the part `down` and carry on.
 */

/**
 * A 200 `/healthz` that never ends and never pauses: 64 KiB every 10 ms (a rate that keeps
 * an unbounded reader, today's code, at a few hundred MB over the test's wait rather than
 * the machine's memory).
 */
async function squatter(t: TapTest): Promise<{ url: string; served: () => number; cutOff: () => number }> {
  let served = 0;
  let cutOff = 0;
  const chunk = Buffer.alloc(64 * 1024, 0x20);
  const server = new LoopbackServer((req, res) => {
    served += 1;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"status":"ok","pad":"');
    const timer = setInterval(() => res.write(chunk), 10);
    res.on('close', () => {
      clearInterval(timer);
      cutOff += 1;
    });
  });
  await server.listen();
  t.teardown(() => server.close());
  return { url: server.url('/healthz'), served: () => served, cutOff: () => cutOff };
}

t.test('link: a squatter streaming an endless /healthz → presence reports the part down, the link lives on', async (t) => {
  const sq = await squatter(t);
  const w = await hostWorld(t, { forwarderHealth: sq.url });
  const link = w.startLink();
  const hostId = w.linkEnv.AGENT_CONNECTORS_HOST_ID;
  const downReports = (): number => w.gw.control.presences.filter((p) => p.body.hostId === hostId && p.body.parts.forwarder === 'down').length;
  await until(() => downReports() >= 1, 'a presence report with the forwarder down', 30_000);
  t.ok(sq.served() >= 1, 'the link did ask the squatter');
  t.ok(sq.cutOff() >= 1, 'and cut its answer off');
  // A second regular report (2 s interval): the link kept running after the cut, and the
  // cut-off stream is not still being read behind it.
  await until(() => downReports() >= 2, 'a second presence report with the forwarder down', 30_000);
  t.equal(link.child.exitCode, null, 'the link is still running');
  t.equal(link.child.signalCode, null, 'and was not killed');
});

for (const command of ['status', 'doctor'] as const) {
  t.test(`${command}: a squatter streaming an endless /healthz → the forwarder is down, ${command} completes`, async (t) => {
    const sq = await squatter(t);
    const state = tempDir(`ac-bounded-${command}-`, t);
    const child = spawn(process.execPath, [CLI, command, '--state-dir', state, '--forwarder-url', sq.url.replace(/\/healthz$/, ''), '--cli-proxy-url', 'http://127.0.0.1:9', '--no-systemd', '--json'], {
      env: { ...process.env, NODE_OPTIONS: '' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    t.teardown(() => void child.kill('SIGKILL'));
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    // A deadline, not a wait: doctor takes 3–8 s on a loaded 2-core machine; on the code before, never.
    await within(exited, 90_000, `${command} to finish`);
    t.ok(sq.cutOff() >= 1, 'the squatter was cut off');
    const report = JSON.parse(out) as Record<string, unknown>;
    if (command === 'status') t.equal((report.parts as Record<string, { state: string } | undefined>).forwarder?.state, 'down', 'status: forwarder down');
    else t.match(JSON.stringify(report), /forwarder_down/, 'doctor: forwarder_down');
  });
}
