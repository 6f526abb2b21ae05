import { once } from 'node:events';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer, connect, type AddressInfo, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { existingUser, killGroup, spawnAsAgent } from '../support/agent-user.js';
import { peerUid, peerUidBySs } from '../../src/http/peer-uid.js';
import { SockDiagHelper } from '../../src/http/sock-diag-helper.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';
import { eventually } from '../support/poll.js';
import { unlessMissing } from '../tools/prerequisite.js';

/*
 * Synthetic /proc/net/tcp{,6} tables in the kernel's own format (net/ipv4/tcp_ipv4.c
 * get_tcp4_sock, net/ipv6/tcp_ipv6.c get_tcp6_sock): each address is the raw bytes of the
 * address printed as 32-bit words in host (little-endian) order, the port as %04X. The
 * hex keys below are written out by hand, not computed, so they check peer-uid's encoding.
 */

const TCP_HEADER = '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode';
const TCP6_HEADER =
  '  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode';

interface Row {
  local: string;
  remote: string;
  /** 0A LISTEN, 01 ESTABLISHED */
  st: string;
  uid: number;
}

function line(sl: number, r: Row, inode: number): string {
  return `${String(sl).padStart(4)}: ${r.local} ${r.remote} ${r.st} 00000000:00000000 00:00000000 00000000 ${String(r.uid).padStart(5)} ${String(0).padStart(8)} ${inode} 1 0000000000000000 20 4 30 10 -1                     `;
}

function table(header: string, rows: Row[]): string {
  return `${header}\n${rows.map((r, i) => line(i, r, 40000 + i)).join('\n')}\n`;
}

/** A temp dir usable as `procRoot`: `<root>/proc/net/tcp` and `tcp6` as given (omitted → no file). */
function procRoot(tcp?: Row[], tcp6?: Row[]): string {
  const root = tempDir('ac-peer-uid-', t);
  mkdirSync(join(root, 'proc', 'net'), { recursive: true });
  if (tcp) writeFileSync(join(root, 'proc', 'net', 'tcp'), table(TCP_HEADER, tcp));
  if (tcp6) writeFileSync(join(root, 'proc', 'net', 'tcp6'), table(TCP6_HEADER, tcp6));
  return root;
}

// 127.0.0.1 as the kernel prints it in /proc/net/tcp, and 127.0.0.2.
const V4_LO = '0100007F';
const V4_LO2 = '0200007F';
const V4_ANY = '00000000';
// ::1, ::, ::ffff:127.0.0.1 and 2001:db8::1 in /proc/net/tcp6.
const V6_LO = '00000000000000000000000001000000';
const V6_ANY = '00000000000000000000000000000000';
const V6_MAPPED_LO = '0000000000000000FFFF00000100007F';
const V6_DOC = 'B80D0120000000000000000001000000';

// Server port 8080 (1F90), client port 50000 (C350), another server port 8081 (1F91).
const SRV = '1F90';
const CLI = 'C350';

const SERVER_UID = 994;
const CLIENT_UID = 1000;
const OTHER_UID = 2000;

/** Every row a real table holds around one connection: the listener, both ends, and noise. */
function v4Rows(server: string, client: string): Row[] {
  return [
    { local: `${V4_ANY}:0016`, remote: `${V4_ANY}:0000`, st: '0A', uid: 0 },
    { local: `${server}:${SRV}`, remote: `${V4_ANY}:0000`, st: '0A', uid: SERVER_UID },
    // the same client port towards another server port: a different connection
    { local: `${client}:${CLI}`, remote: `${server}:1F91`, st: '01', uid: OTHER_UID },
    // the server's own accepted socket (local = server, remote = client): the server's uid
    { local: `${server}:${SRV}`, remote: `${client}:${CLI}`, st: '01', uid: SERVER_UID },
    // the client's socket: local = client, remote = server
    { local: `${client}:${CLI}`, remote: `${server}:${SRV}`, st: '01', uid: CLIENT_UID },
  ];
}

function v6Rows(server: string, client: string): Row[] {
  return [
    { local: `${V6_ANY}:0016`, remote: `${V6_ANY}:0000`, st: '0A', uid: 0 },
    { local: `${server}:${SRV}`, remote: `${V6_ANY}:0000`, st: '0A', uid: SERVER_UID },
    { local: `${client}:${CLI}`, remote: `${server}:1F91`, st: '01', uid: OTHER_UID },
    { local: `${server}:${SRV}`, remote: `${client}:${CLI}`, st: '01', uid: SERVER_UID },
    { local: `${client}:${CLI}`, remote: `${server}:${SRV}`, st: '01', uid: CLIENT_UID },
  ];
}

t.test('synthetic: IPv4 loopback → the uid column of the client socket', async (t) => {
  const root = procRoot(v4Rows(V4_LO, V4_LO), []);
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, root), CLIENT_UID, 'the client row, not the server row or the listener');
  t.equal(await peerUid('127.0.0.1', 50001, '127.0.0.1', 8080, root), undefined, 'another client port: no entry');
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8082, root), undefined, 'another server port: no entry');
});

t.test('synthetic: the listener side of a connection we made, ESTABLISHED only (the upstream guard)', async (t) => {
  // We dialled from 50000 to 8080: the far end is the server's accepted socket.
  const root = procRoot(v4Rows(V4_LO, V4_LO), []);
  t.equal(await peerUid('127.0.0.1', 8080, '127.0.0.1', 50000, root, true), SERVER_UID, 'the accepted socket: the listener\'s owner');
  // A half-open server side (SYN_RECV, st 03) is listed with uid 0 by the kernel: never taken for root.
  const half = procRoot([{ local: `${V4_LO}:${SRV}`, remote: `${V4_LO}:${CLI}`, st: '03', uid: 0 }], []);
  t.equal(await peerUid('127.0.0.1', 8080, '127.0.0.1', 50000, half, true), undefined, 'SYN_RECV: no answer');
  t.equal(await peerUid('127.0.0.1', 8080, '127.0.0.1', 50000, half), 0, 'without the state rule it would pass as root');
});

t.test('synthetic: IPv4 other loopback addresses and ports of every width', async (t) => {
  const root = procRoot(
    [
      { local: `${V4_LO2}:0050`, remote: `${V4_LO}:0016`, st: '01', uid: 1 },
      { local: `${V4_LO}:FFFF`, remote: `${V4_LO2}:0001`, st: '01', uid: 65534 },
      { local: `${V4_LO}:${CLI}`, remote: `${V4_LO2}:${SRV}`, st: '01', uid: 4242 },
    ],
    [],
  );
  t.equal(await peerUid('127.0.0.2', 80, '127.0.0.1', 22, root), 1, 'client 127.0.0.2:80 → server 127.0.0.1:22 (ports zero-padded)');
  t.equal(await peerUid('127.0.0.1', 65535, '127.0.0.2', 1, root), 65534, 'port 65535 → FFFF, port 1 → 0001');
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.2', 8080, root), 4242, 'server on 127.0.0.2');
  t.equal(await peerUid('127.0.0.2', 50000, '127.0.0.1', 8080, root), undefined, 'addresses swapped: no entry');
});

t.test('synthetic: IPv6 ::1 → /proc/net/tcp6', async (t) => {
  const root = procRoot([], v6Rows(V6_LO, V6_LO));
  t.equal(await peerUid('::1', 50000, '::1', 8080, root), CLIENT_UID);
  t.equal(await peerUid('0:0:0:0:0:0:0:1', 50000, '0:0:0:0:0:0:0:1', 8080, root), CLIENT_UID, 'the uncompressed spelling');
  t.equal(await peerUid('::1', 50001, '::1', 8080, root), undefined, 'another client port: no entry');
});

t.test('synthetic: a general IPv6 address (2001:db8::1) is encoded word by word', async (t) => {
  const root = procRoot([], v6Rows(V6_DOC, V6_LO));
  t.equal(await peerUid('::1', 50000, '2001:db8::1', 8080, root), CLIENT_UID);
});

t.test('synthetic: IPv4-mapped, both ends dual-stack sockets → the mapped entry in tcp6', async (t) => {
  const root = procRoot([], v6Rows(V6_MAPPED_LO, V6_MAPPED_LO));
  t.equal(await peerUid('::ffff:127.0.0.1', 50000, '::ffff:127.0.0.1', 8080, root), CLIENT_UID);
  t.equal(await peerUid('::FFFF:127.0.0.1', 50000, '::FFFF:127.0.0.1', 8080, root), CLIENT_UID, 'upper-case prefix');
});

t.test('synthetic: IPv4-mapped on the server, the client an AF_INET socket → its entry is in /proc/net/tcp', async (t) => {
  // A server listening on [::ffff:127.0.0.1] (or ::) sees a plain 127.0.0.1 client as
  // ::ffff:127.0.0.1, but the kernel lists that AF_INET client socket in /proc/net/tcp with
  // plain IPv4 addresses; tcp6 holds only the server's own (mapped) accepted socket.
  const root = procRoot(
    [{ local: `${V4_LO}:${CLI}`, remote: `${V4_LO}:${SRV}`, st: '01', uid: CLIENT_UID }],
    [
      { local: `${V6_MAPPED_LO}:${SRV}`, remote: `${V6_ANY}:0000`, st: '0A', uid: SERVER_UID },
      { local: `${V6_MAPPED_LO}:${SRV}`, remote: `${V6_MAPPED_LO}:${CLI}`, st: '01', uid: SERVER_UID },
    ],
  );
  t.equal(await peerUid('::ffff:127.0.0.1', 50000, '::ffff:127.0.0.1', 8080, root), CLIENT_UID);
});

t.test('synthetic: IPv4 server, the client a dual-stack AF_INET6 socket connected to ::ffff:127.0.0.1 → its entry is in tcp6', async (t) => {
  // The reverse: the server is AF_INET and sees 127.0.0.1, the client (a JVM, or
  // net.connect('::ffff:127.0.0.1')) is listed in tcp6 with mapped addresses.
  const root = procRoot(
    [
      { local: `${V4_LO}:${SRV}`, remote: `${V4_ANY}:0000`, st: '0A', uid: SERVER_UID },
      { local: `${V4_LO}:${SRV}`, remote: `${V4_LO}:${CLI}`, st: '01', uid: SERVER_UID },
    ],
    [{ local: `${V6_MAPPED_LO}:${CLI}`, remote: `${V6_MAPPED_LO}:${SRV}`, st: '01', uid: CLIENT_UID }],
  );
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, root), CLIENT_UID);
});

t.test('synthetic: only the server side of the connection listed → undefined, never the server uid', async (t) => {
  const root = procRoot(
    [
      { local: `${V4_LO}:${SRV}`, remote: `${V4_ANY}:0000`, st: '0A', uid: SERVER_UID },
      { local: `${V4_LO}:${SRV}`, remote: `${V4_LO}:${CLI}`, st: '01', uid: SERVER_UID },
    ],
    [],
  );
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, root), undefined);
});

t.test('synthetic: empty tables, header only → undefined', async (t) => {
  const root = procRoot([], []);
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, root), undefined);
  t.equal(await peerUid('::1', 50000, '::1', 8080, root), undefined);
});

t.test('synthetic: a missing table file → undefined, no throw', async (t) => {
  const noFiles = procRoot();
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, noFiles), undefined, 'no tcp');
  t.equal(await peerUid('::1', 50000, '::1', 8080, noFiles), undefined, 'no tcp6');
  const onlyV4 = procRoot(v4Rows(V4_LO, V4_LO));
  t.equal(await peerUid('::1', 50000, '::1', 8080, onlyV4), undefined, 'tcp present, tcp6 missing');
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, join(noFiles, 'does-not-exist')), undefined, 'no proc root at all');
});

t.test('synthetic: a garbled uid column → undefined', async (t) => {
  const root = tempDir('ac-peer-uid-', t);
  mkdirSync(join(root, 'proc', 'net'), { recursive: true });
  writeFileSync(join(root, 'proc', 'net', 'tcp'), `${TCP_HEADER}\n   0: ${V4_LO}:${CLI} ${V4_LO}:${SRV} 01 00000000:00000000 00:00000000 00000000 xyz 0 1\n`);
  t.equal(await peerUid('127.0.0.1', 50000, '127.0.0.1', 8080, root), undefined);
});

// ---------------------------------------------------------------------------------------
// The real kernel tables: a real loopback connection, the server side's accepted socket.

async function listenOn(host: string): Promise<Server> {
  const server = createServer();
  server.listen(0, host);
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return server;
}

const helper = new SockDiagHelper();
t.teardown(() => helper.close());

/**
 * Connects to `server` from `dest` and returns peerUid of the accepted socket, read at once;
 * the other two lookups (the sock_diag helper, ss) must give the same answer.
 */
async function realPeerUid(tt: TapTest, server: Server, client: () => void): Promise<{ uid: number | undefined; accepted: Socket }> {
  const accepted = once(server, 'connection') as Promise<[Socket]>;
  client();
  const [s] = await accepted;
  t.teardown(() => s.destroy());
  const tuple = [s.remoteAddress ?? '', s.remotePort ?? 0, s.localAddress ?? '', s.localPort ?? 0] as const;
  const uid = await peerUid(...tuple);
  tt.equal(await helper.lookup(...tuple), uid, 'the sock_diag helper agrees');
  tt.equal(await peerUidBySs(...tuple), uid, 'ss agrees');
  return { uid, accepted: s };
}

function connectFrom(server: Server, dest: string): () => void {
  return () => {
    const c = connect({ port: (server.address() as AddressInfo).port, host: dest });
    c.on('error', () => undefined);
    t.teardown(() => c.destroy());
  };
}

function hasIPv6Loopback(): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen(0, '::1', () => s.close(() => resolve(true)));
  });
}

t.test('real: a loopback TCP connection from this process → process.getuid()', async (t) => {
  const server = await listenOn('127.0.0.1');
  const { uid, accepted } = await realPeerUid(t, server, connectFrom(server, '127.0.0.1'));
  t.equal(accepted.remoteAddress, '127.0.0.1');
  t.equal(uid, process.getuid?.());
});

t.test('real: ::1', { skip: unlessMissing(t, (await hasIPv6Loopback()) ? undefined : 'no IPv6 loopback here') }, async (t) => {
  const server = await listenOn('::1');
  const { uid } = await realPeerUid(t, server, connectFrom(server, '::1'));
  t.equal(uid, process.getuid?.());
});

t.test('real: server on [::ffff:127.0.0.1], both ends mapped', async (t) => {
  const server = await listenOn('::ffff:127.0.0.1');
  const { uid, accepted } = await realPeerUid(t, server, connectFrom(server, '::ffff:127.0.0.1'));
  t.equal(accepted.remoteAddress, '::ffff:127.0.0.1');
  t.equal(uid, process.getuid?.());
});

t.test('real: server on [::ffff:127.0.0.1], client a plain 127.0.0.1 (AF_INET) socket', async (t) => {
  const server = await listenOn('::ffff:127.0.0.1');
  const { uid, accepted } = await realPeerUid(t, server, connectFrom(server, '127.0.0.1'));
  t.equal(accepted.remoteAddress, '::ffff:127.0.0.1', 'the server sees a mapped address');
  t.equal(uid, process.getuid?.(), 'the AF_INET client socket is found (it is in /proc/net/tcp)');
});

t.test('real: server on 127.0.0.1, client a dual-stack socket connecting to ::ffff:127.0.0.1', async (t) => {
  const server = await listenOn('127.0.0.1');
  const { uid, accepted } = await realPeerUid(t, server, connectFrom(server, '::ffff:127.0.0.1'));
  t.equal(accepted.remoteAddress, '127.0.0.1', 'the server sees plain IPv4');
  t.equal(uid, process.getuid?.(), 'the AF_INET6 client socket is found (it is in /proc/net/tcp6, mapped)');
});

t.test('real: a connection from another user (nobody, via setpriv) → that user\'s uid', { skip: unlessMissing(t, process.getuid?.() === 0 ? undefined : 'needs root to switch to nobody') }, async (t) => {
  const server = await listenOn('127.0.0.1');
  const port = (server.address() as AddressInfo).port;
  // The client holds its connection open until its stdin closes (at teardown).
  const script = `const s=require('net').connect(${port},'127.0.0.1');s.on('error',(e)=>{console.error(e.message);process.exit(3)});process.stdin.resume();process.stdin.on('end',()=>process.exit(0));`;
  const accepted = once(server, 'connection') as Promise<[Socket]>;
  const child = spawnAsAgent(existingUser('nobody'), 'exec "$@"', { env: { PATH: '/usr/bin:/bin' }, args: [process.execPath, '-e', script] });
  t.teardown(() => {
    child.stdin?.end();
    killGroup(child);
  });
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  let connected = false;
  // A client that cannot start (or connect) fails the test now, not at the file's timeout.
  const died = once(child, 'close').then(([code, signal]) => {
    if (!connected) throw new Error(`the client as nobody exited (${String(code ?? signal)}) before it connected: ${stderr}`);
    return [] as never;
  });
  const [s] = await Promise.race([accepted, died]);
  connected = true;
  t.teardown(() => s.destroy());
  const tuple = [s.remoteAddress ?? '', s.remotePort ?? 0, s.localAddress ?? '', s.localPort ?? 0] as const;
  t.equal(await peerUid(...tuple), 65534, 'the uid of nobody');
  t.equal(await helper.lookup(...tuple), 65534, 'the sock_diag helper: nobody');
  t.equal(await peerUidBySs(...tuple), 65534, 'ss: nobody (printed as uid:65534)');
});

t.test('real: the sock_diag helper answers undefined for no such socket, and a killed helper is replaced', async (t) => {
  const server = await listenOn('127.0.0.1');
  const { accepted } = await realPeerUid(t, server, connectFrom(server, '127.0.0.1'));
  const tuple = [accepted.remoteAddress ?? '', accepted.remotePort ?? 0, accepted.localAddress ?? '', accepted.localPort ?? 0] as const;
  t.equal(await helper.lookup(tuple[0], 1, tuple[2], tuple[3]), undefined, 'another client port: none');
  t.equal(await helper.lookup('not-an-address', 1, tuple[2], tuple[3]), undefined, 'a malformed address is not sent');
  const first = helper.pid;
  t.ok(first, 'the helper runs');
  process.kill(first!, 'SIGKILL');
  await eventually(() => helper.pid === undefined);
  t.equal(await helper.lookup(...tuple), process.getuid?.(), 'the next lookup starts a new helper and is answered');
  t.not(helper.pid, first, 'a new process');
});
