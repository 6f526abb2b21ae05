/**
 * The peers under test, each reachable at a loopback port, each with its own upstream port:
 * direct (the upstream itself, the limit), nginx, the Node floor (bench/floor-proxy.ts: the
 * least a Node proxy of this shape can do), the forwarder (default log level info, and
 * optionally at warn to show what the access line costs), and the cli-proxy.
 */
import type { ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { waitAuditDrained, type AuditDrain } from './audit-drain.js';
import { startNginx } from './nginx.js';
import { FLOOR_PROXY_JS } from './paths.js';
import { freePort, NOFILE, partNodeFlags, spawnTracked, stopChild, waitForJsonLine, waitForPort } from './proc.js';

export const ALL_PEERS = ['direct', 'nginx', 'node-floor', 'forwarder', 'forwarder-warn', 'cli-proxy'] as const;
/** Peers run only when asked for: `forwarder-base` is another build's forwarder (`--base-cli`). */
export const OPTIONAL_PEERS = ['forwarder-base'] as const;
export type PeerName = (typeof ALL_PEERS)[number] | (typeof OPTIONAL_PEERS)[number];

/** Named upstream resources; each peer maps them to its own URL (the forwarder: one binding each). */
export type Endpoints = Record<string, string>;

export interface ProcPeer {
  child: ChildProcess;
  port: number;
  logPath: string;
  /** The processes whose CPU and RSS count as the proxy's. */
  pids(): number[];
  stop(): Promise<void>;
}

export interface Peer {
  name: PeerName;
  port: number;
  upstreamPort: number;
  /** Path (and query) on the peer for a named endpoint. */
  path(endpoint: string): string;
  url(endpoint: string): string;
  /** The proxy's processes; empty for direct (there is no proxy). */
  pids(): number[];
  /**
   * The cli-proxy: waits until its audit events are all written (bench/lib/audit-drain.ts),
   * for the gap between two cells. Undefined for the other peers and when nothing is
   * reported (audit off).
   */
  auditDrained(): Promise<AuditDrain | undefined>;
  stop(): Promise<void>;
}

export interface PeerStartOptions {
  cli: string;
  upstreamPort: number;
  endpoints: Endpoints;
  /** Extra node flags for the Node peers (`--cpu-prof`, …). */
  nodeArgs?: string[];
  /** Extra CLI options for the forwarder and cli-proxy peers (`--metrics-listen …`, `--no-audit`). */
  extraArgs?: string[];
  /** The Node floor reads its token from a file on every request, as a secret-holding proxy must (default: a fixed header). */
  floorReadsToken?: boolean;
  /** The CLI of the `forwarder-base` peer. */
  baseCli?: string | undefined;
  workDir: string;
}

export const BENCH_TOKEN = 'bench-token-0123456789abcdef';

/** The cli-proxy peer's audit bound: above the calls of any run (a full run makes ~40 000 a repetition). */
export const UNREACHED_AUDIT_BOUND = 100_000_000;

export function bindingIdFor(endpoint: string): string {
  return `bench_${endpoint}_binding`;
}

function endpointPath(endpoints: Endpoints, e: string): string {
  const p = endpoints[e];
  if (p === undefined) throw new Error(`unknown endpoint ${e}`);
  return p;
}

function makePeer(name: PeerName, proc: ProcPeer | undefined, port: number, upstreamPort: number, path: (e: string) => string, metricsPort?: number): Peer {
  return {
    name,
    port,
    upstreamPort,
    path,
    url: (e) => `http://127.0.0.1:${port}${path(e)}`,
    pids: () => (proc ? proc.pids() : []),
    auditDrained: async () => (proc && metricsPort !== undefined ? waitAuditDrained(metricsPort, proc.pids()) : undefined),
    stop: async () => {
      await proc?.stop();
    },
  };
}

/** A Node peer (`script`, default the CLI) listening on a free loopback port; `extraEnv` joins the environment. */
export async function startNode(
  opts: Pick<PeerStartOptions, 'cli' | 'nodeArgs'>,
  dir: string,
  args: string[],
  extraEnv: Record<string, string> = {},
  script = opts.cli,
): Promise<ProcPeer> {
  const port = await freePort();
  const logPath = join(dir, 'stdout.log');
  const out = openSync(logPath, 'a');
  const env = { ...process.env, ...extraEnv };
  delete env.NOTIFY_SOCKET;
  delete env.WATCHDOG_USEC;
  const child = spawnTracked(process.execPath, [...(opts.nodeArgs ?? []), script, ...args, '--listen', `127.0.0.1:${port}`], {
    stdio: ['ignore', out, out],
    env,
    cwd: dir,
    nofile: NOFILE,
  });
  closeSync(out);
  let exited: string | undefined;
  child.once('exit', (code, signal) => (exited = `exited ${code ?? signal}`));
  const tail = (): string => {
    try {
      return readFileSync(logPath, 'utf8').split('\n').slice(-12).join('\n');
    } catch {
      return '(no log: the run was torn down)';
    }
  };
  // A bound, not a wait: a Node start took over 60 s on this 2-core machine at load 40.
  await Promise.race([
    waitForPort(port, 180_000),
    new Promise<never>((_, reject) => child.once('exit', () => reject(new Error(`${args[0]} ${exited ?? 'exited'} before listening:\n${tail()}`)))),
  ]);
  const pid = child.pid as number;
  return { child, port, logPath, pids: () => [pid], stop: () => stopChild(child, 'SIGTERM') };
}

export async function startPeer(name: PeerName, opts: PeerStartOptions): Promise<Peer> {
  const { endpoints, upstreamPort } = opts;
  const dir = mkdtempSync(join(opts.workDir, `${name}-`));
  const up = `http://127.0.0.1:${upstreamPort}`;
  switch (name) {
    case 'direct':
      return makePeer(name, undefined, upstreamPort, upstreamPort, (e) => endpointPath(endpoints, e));
    case 'nginx': {
      const port = await freePort();
      const proc = await startNginx(dir, port, upstreamPort);
      return makePeer(name, proc, port, upstreamPort, (e) => endpointPath(endpoints, e));
    }
    case 'node-floor': {
      const args = [String(upstreamPort)];
      if (opts.floorReadsToken) {
        const tokenFile = join(dir, 'bench.token');
        writeFileSync(tokenFile, `${BENCH_TOKEN}\n`, { mode: 0o600 });
        args.push('--token-file', tokenFile);
      }
      // The floor runs with the forwarder's node flags: it is the forwarder's path without our code.
      const proc = await startNode({ ...opts, nodeArgs: [...(await partNodeFlags(opts.cli, 'forwarder')), ...(opts.nodeArgs ?? [])] }, dir, args, {}, FLOOR_PROXY_JS);
      return makePeer(name, proc, proc.port, upstreamPort, (e) => endpointPath(endpoints, e));
    }
    case 'forwarder':
    case 'forwarder-base':
    case 'forwarder-warn': {
      const fdir = join(dir, 'mcp-forwarder');
      mkdirSync(fdir, { recursive: true, mode: 0o700 });
      const tokenFile = join(fdir, 'bench.token');
      writeFileSync(tokenFile, `${BENCH_TOKEN}\n`, { mode: 0o600 });
      const instances = Object.fromEntries(
        Object.keys(endpoints).map((e) => [bindingIdFor(e), { instanceId: `bench-${e}`, upstreamUrl: `${up}${endpointPath(endpoints, e)}`, tokenFile }]),
      );
      writeFileSync(join(fdir, 'instances.json'), JSON.stringify(instances, null, 2), { mode: 0o600 });
      const level = name === 'forwarder-warn' ? 'warn' : 'info';
      if (name === 'forwarder-base' && opts.baseCli === undefined) throw new Error('forwarder-base needs --base-cli');
      const cli = name === 'forwarder-base' ? (opts.baseCli as string) : opts.cli;
      const proc = await startNode({ ...opts, cli, nodeArgs: [...(await partNodeFlags(cli, 'forwarder')), ...(opts.nodeArgs ?? [])] }, dir, ['forwarder', '--state-dir', dir, '--log-level', level, ...(opts.extraArgs ?? [])]);
      return makePeer(name, proc, proc.port, upstreamPort, (e) => {
        endpointPath(endpoints, e);
        return `/i/${bindingIdFor(e)}/mcp`;
      });
    }
    case 'cli-proxy': {
      const cdir = join(dir, 'cli-proxy');
      mkdirSync(cdir, { recursive: true, mode: 0o700 });
      const tokenFile = join(cdir, 'bench.token');
      writeFileSync(tokenFile, `${BENCH_TOKEN}\n`, { mode: 0o600 });
      const catalog = { bench: { upstream: up, tokenFile, inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } } };
      writeFileSync(join(cdir, 'providers.json'), JSON.stringify(catalog, null, 2), { mode: 0o600 });
      // Metrics on, always (audit on or off, so both sides of an A/B pay the same ~2 µs a
      // call for them, docs/metrics.md): the bench reads the audit queue there between cells.
      const extra = opts.extraArgs ?? [];
      const metrics = extra.includes('--metrics-listen') ? [] : ['--metrics-listen', '127.0.0.1:0'];
      // The audit as on a host whose link uploads: a bound no run reaches. At the default
      // (10 000) the spool filled up during the c=16 cell and every later call first
      // dropped the oldest event: the link-away mode, measured apart by --audit-wrk.
      const bound = extra.includes('--no-audit') || extra.includes('--audit-max-events') ? [] : ['--audit-max-events', String(UNREACHED_AUDIT_BOUND)];
      const proc = await startNode({ ...opts, nodeArgs: [...(await partNodeFlags(opts.cli, 'cli-proxy')), ...(opts.nodeArgs ?? [])] }, dir, ['cli-proxy', '--state-dir', dir, '--log-level', 'info', ...metrics, ...bound, ...extra]);
      const metricsPort = metrics.length ? (await waitForJsonLine<{ port: number }>(proc.logPath, (l) => l.msg === 'metrics listening', 30_000)).port : undefined;
      return makePeer(name, proc, proc.port, upstreamPort, (e) => `/p/bench${endpointPath(endpoints, e)}`, metricsPort);
    }
  }
}

export function newWorkDir(): string {
  return mkdtempSync(join(tmpdir(), 'ac-bench-'));
}

export function removeWorkDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
