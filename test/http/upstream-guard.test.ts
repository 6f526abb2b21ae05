import { once } from 'node:events';
import { createServer as createHttpServer } from 'node:http';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import t from 'tap';
import { AppError } from '../../src/errors.js';
import { peerUidBySs, type PeerUidLookup } from '../../src/http/peer-uid.js';
import { SockDiagHelper } from '../../src/http/sock-diag-helper.js';
import { createUpstreamAgent } from '../../src/http/upstream-agent.js';
import { UpstreamGuard } from '../../src/http/upstream-guard.js';
import { existingUser, spawnAsAgent } from '../support/agent-user.js';
import { memoryLogger } from '../support/memory-log.js';
import { Wakeups } from '../support/wakeups.js';
import { unlessMissing } from '../tools/prerequisite.js';

/*
 * The upstream guard's owner lookup: for a connection we made, the kernel's owner of the
 * socket at the other end (the listener's side), ESTABLISHED only; and the guard around
 * undici's connect, which refuses before any byte is written.
 */

const OWN = process.getuid?.() ?? -1;
const helper = new SockDiagHelper();
t.teardown(() => helper.close());

const bySockDiag: PeerUidLookup = (...a) => helper.lookup(...a, true);
const bySs: PeerUidLookup = (...a) => peerUidBySs(...a, 'ss', true);

async function listenOn(server: Server): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return (server.address() as AddressInfo).port;
}

async function dial(port: number, allowHalfOpen = false): Promise<Socket> {
  const c = connect({ port, host: '127.0.0.1', allowHalfOpen });
  c.on('error', () => undefined);
  t.teardown(() => c.destroy());
  await once(c, 'connect');
  return c;
}

function tupleOf(s: Socket): [string, number, string, number] {
  return [s.remoteAddress ?? '', s.remotePort ?? 0, s.localAddress ?? '', s.localPort ?? 0];
}

/** A loopback listener run as `nobody` (python3): prints its port, accepts, reads and counts bytes. */
async function listenerAsNobody(): Promise<{ port: number; bytes: () => number; accepted: () => number; closed: (n: number) => Promise<void> }> {
  const script = String.raw`
import socket, sys, threading
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(16)
print('port %d' % s.getsockname()[1], flush=True)
def serve(c):
    while True:
        b = c.recv(65536)
        if not b: break
        print('bytes %d' % len(b), flush=True)
    c.close(); print('closed', flush=True)
while True:
    c, _ = s.accept(); print('accepted', flush=True)
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`;
  const child = spawnAsAgent(existingUser('nobody'), 'exec python3 -c "$1"', { env: { PATH: '/usr/bin:/bin' }, args: [script] });
  t.teardown(() => {
    child.kill('SIGKILL');
  });
  const lines: string[] = [];
  const arrivals = new Wakeups();
  const rl = createInterface({ input: child.stdout! });
  const port = await new Promise<number>((resolve, reject) => {
    rl.on('line', (line) => {
      lines.push(line);
      arrivals.wake();
      const m = /^port (\d+)$/.exec(line);
      if (m) resolve(Number(m[1]));
    });
    child.once('exit', (code) => reject(new Error(`the listener as nobody exited (${code})`)));
  });
  return {
    port,
    bytes: () => lines.filter((l) => l.startsWith('bytes ')).reduce((n, l) => n + Number(l.slice(6)), 0),
    accepted: () => lines.filter((l) => l === 'accepted').length,
    closed: async (n) => {
      await arrivals.until(() => (lines.filter((l) => l === 'closed').length >= n ? true : undefined), 10_000, () => `not ${n} closed: ${lines.join(' | ')}`);
    },
  };
}

const asRoot = unlessMissing(t, OWN === 0 ? undefined : 'needs root to run a listener as nobody');

t.test('real: the owner of a listener we connected to, our own → our uid (sock_diag, ss)', async (t) => {
  const port = await listenOn(createServer((s) => s.on('error', () => undefined)));
  const c = await dial(port);
  t.equal(await bySockDiag(...tupleOf(c)), OWN, 'sock_diag');
  t.equal(await bySs(...tupleOf(c)), OWN, 'ss');
});

t.test('real: a listener run by nobody → 65534, whether or not it accepted yet (sock_diag, ss)', { skip: asRoot }, async (t) => {
  const nobody = await listenerAsNobody();
  const c = await dial(nobody.port);
  // The accepted socket carries the listener's owner from the handshake on, before accept().
  t.equal(await bySockDiag(...tupleOf(c)), 65534, 'sock_diag');
  t.equal(await bySs(...tupleOf(c)), 65534, 'ss');
});

t.test('real: only an ESTABLISHED far end counts: a listener side already closed is no answer', async (t) => {
  // The server closes each connection at once: its side goes to FIN_WAIT, ours to CLOSE_WAIT.
  const port = await listenOn(createServer((s) => s.on('error', () => undefined).end()));
  // Half-open kept: our side stays in CLOSE_WAIT, so the tuple still names both ends.
  const c = await dial(port, true);
  c.resume();
  await once(c, 'end');
  const tuple = tupleOf(c);
  t.equal(await helper.lookup(...tuple), OWN, 'the far end is still there, in another state');
  t.equal(await bySockDiag(...tuple), undefined, 'sock_diag, ESTABLISHED only: none');
  t.equal(await bySs(...tuple), undefined, 'ss, state established: none');
});

t.test('trusted: root and our own always; a listed UID unless it is an agent', async (t) => {
  const agents = new Set([2001]);
  const guard = new UpstreamGuard({ what: 'upstream', listenerOwner: async () => bySockDiag, ownerUids: new Set([2000, 2001]), isAgent: (u) => agents.has(u) });
  t.ok(guard.trusted(0), 'root');
  t.ok(guard.trusted(OWN), 'our own');
  t.ok(guard.trusted(2000), 'listed');
  t.notOk(guard.trusted(2001), 'listed, but an agent');
  t.notOk(guard.trusted(2002), 'not listed');
  const unlisted = new UpstreamGuard({ what: 'upstream', listenerOwner: async () => bySockDiag });
  t.notOk(unlisted.trusted(2000), 'nothing listed: nobody else');
});

/** One request through the guarded upstream agent: its status, or the code it was refused with. */
async function through(guard: UpstreamGuard, url: string): Promise<number | string> {
  const agent = createUpstreamAgent(undefined, guard);
  t.teardown(() => agent.close());
  const u = new URL(url);
  try {
    const res = await agent.request({ origin: u.origin, path: u.pathname, method: 'GET', headers: { authorization: 'Bearer tok-guard-unit' } });
    await res.body.dump();
    return res.statusCode;
  } catch (err) {
    return err instanceof AppError ? err.code : String(err);
  }
}

t.test('guarded agent: a listener of nobody gets no byte; ours is served; our own port is never dialled', { skip: asRoot }, async (t) => {
  const mem = memoryLogger();
  const seen: number[] = [];
  const ours = createHttpServer((_req, res) => res.end('ok'));
  ours.on('connection', () => seen.push(1));
  const ourPort = await listenOn(ours);
  const reservedPort = await listenOn(createServer((s) => (seen.push(2), s.destroy())));
  const guard = new UpstreamGuard({ what: 'upstream', listenerOwner: async () => bySockDiag, reservedPorts: () => [reservedPort], log: mem.log });

  t.equal(await through(guard, `http://127.0.0.1:${ourPort}/x`), 200, 'our own listener: served');

  const nobody = await listenerAsNobody();
  t.equal(await through(guard, `http://127.0.0.1:${nobody.port}/x`), 'upstream_untrusted', 'nobody\'s listener: refused');
  await nobody.closed(1);
  t.equal(nobody.accepted(), 1, 'the connection was made (the check needs it)');
  t.equal(nobody.bytes(), 0, 'and not one byte written to it');
  t.ok(mem.records.some((l) => l.uid === 65534 && String(l.msg).startsWith('upstream listener not trusted')), 'logged with the uid');

  t.equal(await through(guard, `http://127.0.0.1:${reservedPort}/x`), 'upstream_loop', 'our own reserved port: refused');
  t.equal(await through(guard, `http://localhost:${reservedPort}/x`), 'upstream_loop', 'by name too');
  t.notOk(seen.includes(2), 'no connection ever reached the reserved port');
});
