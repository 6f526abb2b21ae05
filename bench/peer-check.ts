import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { peerUid, peerUidBySs, type PeerUidLookup } from '../src/http/peer-uid.js';
import { SockDiagHelper } from '../src/http/sock-diag-helper.js';
import { CLK_TCK, cpuMicros, spawnTracked, stopChild } from './lib/proc.js';

/**
 * `npm run bench -- --peer`: what deciding one new connection's peer UID costs, in CPU,
 * with 1 000 and 16 000 unrelated loopback sockets open on the host (docs/access.md). Two
 * candidates: reading /proc/net/tcp{,6} (the kernel formats every socket) and `ss` with a
 * 4-tuple filter (sock_diag: the filter runs in the kernel, one socket is formatted); for
 * ss the child's CPU (fork, exec, its run) is counted with the parent's.
 */

/** Holds `count` sockets (count/2 loopback connections, both ends) until its stdin closes. */
const HOLDER = `
const net = require('net');
const count = Number(process.argv[1]);
const keep = [];
const server = net.createServer((s) => keep.push(s));
server.listen(0, '127.0.0.1', async () => {
  const port = server.address().port;
  let open = 0;
  while (open < count / 2) {
    const batch = Math.min(200, count / 2 - open);
    await Promise.all(Array.from({ length: batch }, () => new Promise((resolve, reject) => {
      const c = net.connect(port, '127.0.0.1', resolve);
      c.on('error', reject);
      keep.push(c);
    })));
    open += batch;
  }
  process.stdout.write('ready\\n');
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

/** utime+stime of this process, and of its children (waited-for ones, and the helper), in microseconds. */
function cpu(helperCpu: () => number): { self: number; children: number } {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const u = process.cpuUsage();
  return { self: u.user + u.system, children: ((Number(f[13]) + Number(f[14])) * 1e6) / CLK_TCK + helperCpu() };
}

function tcpInUse(): number {
  const m = /^TCP: inuse (\d+)/m.exec(readFileSync('/proc/net/sockstat', 'utf8'));
  const m6 = /^TCP6: inuse (\d+)/m.exec(readFileSync('/proc/net/sockstat6', 'utf8'));
  return Number(m?.[1] ?? 0) + Number(m6?.[1] ?? 0);
}

export interface PeerCheckFigure {
  sockets: number;
  method: 'procfs' | 'ss per connection' | 'sock_diag helper' | 'upstream guard';
  samples: number;
  /** Mean CPU per decided connection, ms (this process + children). */
  cpuMs: number;
  /** Of which in children (ss), ms. */
  childCpuMs: number;
  /** Mean wall time per decision, ms. */
  wallMs: number;
}

/**
 * `side`: whose tuple is looked up: the accepted socket's (the inbound peer check finds the
 * client) or the dialled one's (the upstream guard finds the listener's side, ESTABLISHED).
 */
async function measure(
  server: Server,
  lookup: PeerUidLookup,
  samples: number,
  own: number,
  helperCpu: () => number,
  side: 'accepted' | 'dialled' = 'accepted',
): Promise<{ cpuMs: number; childCpuMs: number; wallMs: number }> {
  const port = (server.address() as AddressInfo).port;
  let wall = 0;
  let self = 0;
  let children = 0;
  for (let i = 0; i < samples; i++) {
    const accepted = once(server, 'connection') as Promise<[Socket]>;
    const client = connect(port, '127.0.0.1');
    await once(client, 'connect');
    const [s] = await accepted;
    const before = cpu(helperCpu);
    const t0 = process.hrtime.bigint();
    const e = side === 'accepted' ? s : client;
    const uid = await lookup(e.remoteAddress ?? '', e.remotePort ?? 0, e.localAddress ?? '', e.localPort ?? 0);
    wall += Number(process.hrtime.bigint() - t0) / 1e6;
    const after = cpu(helperCpu);
    self += after.self - before.self;
    children += after.children - before.children;
    client.destroy();
    s.destroy();
    if (uid !== own) throw new Error(`peer check answered uid ${String(uid)}, expected ${own}`);
  }
  return { cpuMs: (self + children) / 1000 / samples, childCpuMs: children / 1000 / samples, wallMs: wall / samples };
}

export async function runPeerCheck(log: (line: string) => void, sizes = [1_000, 16_000]): Promise<PeerCheckFigure[]> {
  const own = process.getuid?.() ?? 0;
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const figures: PeerCheckFigure[] = [];
  // The helper's CPU is its own process's, not a child's we wait for: read it from /proc.
  const helper = new SockDiagHelper();
  try {
    for (const sockets of sizes) {
      const holder = spawnTracked(process.execPath, ['-e', HOLDER, String(sockets)], { stdio: ['pipe', 'pipe', 'inherit'], nofile: sockets + 1_000 });
      try {
        const lines = createInterface({ input: holder.stdout! });
        const ready = new Promise<void>((resolve, reject) => {
          lines.on('line', (l) => l === 'ready' && resolve());
          holder.once('exit', (code) => reject(new Error(`socket holder exited ${String(code)} before opening ${sockets} sockets (RLIMIT_NOFILE?)`)));
        });
        await ready;
        log(`peer check: ${sockets} sockets held (TCP in use on the host: ${tcpInUse()})`);
        for (const [method, lookup, samples] of [
          ['procfs', (...a: Parameters<PeerUidLookup>) => peerUid(...a), sockets > 5_000 ? 20 : 50],
          ['ss per connection', (...a: Parameters<PeerUidLookup>) => peerUidBySs(...a), 200],
          ['sock_diag helper', (...a: Parameters<PeerUidLookup>) => helper.lookup(...a), 2_000],
          // Once per new plain-http loopback upstream connection (src/http/upstream-guard.ts).
          ['upstream guard', (...a: Parameters<PeerUidLookup>) => helper.lookup(...a, true), 2_000],
        ] as const) {
          const helperCpu = (): number => (helper.pid === undefined ? 0 : cpuMicros(helper.pid));
          const side = method === 'upstream guard' ? 'dialled' : 'accepted';
          await measure(server, lookup, 3, own, helperCpu, side); // warm-up (and the helper's start)
          const r = await measure(server, lookup, samples, own, helperCpu, side);
          const fig: PeerCheckFigure = { sockets, method, samples, ...r };
          figures.push(fig);
          log(`  ${method.padEnd(18)} ${r.cpuMs.toFixed(2)} ms CPU per connection (children ${r.childCpuMs.toFixed(2)}), ${r.wallMs.toFixed(2)} ms wall, ${samples} samples`);
        }
      } finally {
        holder.stdin?.end();
        await stopChild(holder);
      }
    }
  } finally {
    helper.close();
    server.close();
  }
  return figures;
}
