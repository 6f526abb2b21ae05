import { once } from 'node:events';
import { createServer, type Server } from 'node:net';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { startCli } from '../test/support/cli-proc.js';
import { within } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';

/*
 * A service that fails ends the process (black-box, the built CLI): a long-running part
 * whose port is taken must exit 1 with the cause on stderr, not log "service failed" and
 * linger serving nothing (systemd would leave the unit "activating" for good).
 */

async function takenPort(t: TapTest): Promise<number> {
  const server: Server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return (server.address() as AddressInfo).port;
}

const cases: Array<{ name: string; args: (port: number) => string[]; service: string }> = [
  { name: 'forwarder', service: 'forwarder', args: (port) => ['forwarder', '--listen', `127.0.0.1:${port}`] },
  { name: 'cli-proxy', service: 'cli-proxy', args: (port) => ['cli-proxy', '--listen', `127.0.0.1:${port}`] },
  // dev runs every part; the forwarder's port taken must take the whole process down.
  { name: 'dev', service: 'forwarder', args: (port) => ['dev', '--listen', `127.0.0.1:${port}`, '--cli-listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0'] },
  { name: 'dev (its metrics port)', service: 'metrics', args: (port) => ['dev', '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--metrics-listen', `127.0.0.1:${port}`] },
];

for (const c of cases) {
  t.test(`${c.name} on a port in use exits 1 with the cause on stderr`, async (t) => {
    const port = await takenPort(t);
    const proc = startCli([...c.args(port), '--state-dir', tempDir()]);
    t.teardown(async () => {
      await proc.stop('SIGKILL');
    });
    const exit = await within(proc.exited, 30_000, `${c.name} to exit`);
    t.equal(exit.code, 1, 'exit 1');
    t.equal(exit.signal, null, 'by itself, not killed');
    const stderr = proc.stderr.join('\n');
    t.match(stderr, new RegExp(`agent-connectors: ${c.service}: listen EADDRINUSE: address already in use 127\\.0\\.0\\.1:${port}`), 'stderr names the part and the cause');
    t.notMatch(stderr, /did not end after the failure/, 'ended because everything was released, not by the last resort');
    t.ok(proc.logs.some((l) => l.msg === 'service failed' && l.service === c.service), 'and the log says which service failed');
  });
}
