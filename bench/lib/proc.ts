/**
 * Process plumbing for the benchmark: spawning peers with a raised fd limit, reading CPU
 * time and RSS from /proc, waiting for ports and log lines, and tearing everything down.
 */
import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { connect, createServer, type AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { PartName } from '../../src/data/package-parts.js';

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Every child the harness started; killed on exit, whatever happens. */
const children = new Set<ChildProcess>();

export function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** SIGKILLs every tracked child and its own children (nginx workers outlive a killed master). */
export function killAll(): void {
  for (const c of children) {
    if (c.exitCode !== null || c.signalCode !== null || c.pid === undefined) continue;
    for (const pid of childPids(c.pid)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    c.kill('SIGKILL');
  }
}

let cleanupInstalled = false;
/** Kills every tracked child when the harness exits or is interrupted. */
export function installCleanup(): void {
  if (cleanupInstalled) return;
  cleanupInstalled = true;
  process.once('exit', killAll);
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      killAll();
      process.exit(130);
    });
  }
}

/** Soft and hard RLIMIT_NOFILE of this process (what children inherit and may raise to). */
export function nofileLimits(): { soft: number; hard: number } {
  const m = /^Max open files\s+(\d+|unlimited)\s+(\d+|unlimited)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
  const n = (v: string | undefined): number => (v === undefined || v === 'unlimited' ? Number.MAX_SAFE_INTEGER : Number(v));
  return { soft: n(m?.[1]), hard: n(m?.[2]) };
}

/**
 * The fd limit the peers and clients run with: 65 536, or the hard limit when that is
 * lower and cannot be raised (a container without CAP_SYS_RESOURCE).
 */
export const NOFILE = Math.min(65_536, nofileLimits().hard);

/**
 * Idle streams every proxy can hold within NOFILE: two sockets each, plus its own files.
 * nginx sizes worker_connections to the fd limit and, once fewer than 1/16 of them are
 * free, closes connections still waiting for their request line ("worker_connections are
 * not enough, reusing connections"): stay below 15/16.
 */
export const MAX_PROXY_STREAMS = Math.min(
  Math.floor(((NOFILE * 15) / 16 - 64) / 2),
  // The proxies' own connection cap (src/http/peer-limits.ts): past it they answer 503.
  Math.floor((NOFILE - Math.max(128, Math.floor(NOFILE / 8))) / 2),
);

let prlimitOk: boolean | undefined;
function hasPrlimit(): boolean {
  prlimitOk ??= ['/usr/bin/prlimit', '/bin/prlimit'].some((p) => existsSync(p));
  return prlimitOk;
}

/**
 * Spawns `cmd args` with the soft RLIMIT_NOFILE raised to `nofile` when it is lower.
 * `prlimit` execs the command, so the child's pid is the command's own pid (CPU and RSS
 * are read from it).
 */
export function spawnTracked(cmd: string, args: string[], opts: SpawnOptions & { nofile?: number }): ChildProcess {
  const { nofile, ...rest } = opts;
  const { soft, hard } = nofileLimits();
  const want = nofile === undefined ? soft : Math.min(nofile, hard);
  const child =
    want > soft && hasPrlimit()
      ? spawn('prlimit', [`--nofile=${want}:${hard === Number.MAX_SAFE_INTEGER ? 'unlimited' : hard}`, '--', cmd, ...args], rest)
      : spawn(cmd, args, rest);
  return track(child);
}

/**
 * Node's flags for `part` as the build of `cli` (a `dist/cli.js`) ships them in its units:
 * its own `PART_NODE_FLAGS`, read from that build, so a before/after pair (`--base-cli`,
 * `BENCH_CLI`) runs each build the way it is installed. A build from before the list
 * (none there) ran with none. `BENCH_NO_NODE_FLAGS=1` drops them (a with/without pair of
 * one build).
 */
export async function partNodeFlags(cli: string, part: PartName): Promise<string[]> {
  if (process.env.BENCH_NO_NODE_FLAGS === '1') return [];
  const file = join(dirname(cli), 'data', 'package-parts.js');
  if (!existsSync(file)) return [];
  const mod = (await import(pathToFileURL(file).href)) as { PART_NODE_FLAGS?: Partial<Record<string, readonly string[]>> };
  return [...(mod.PART_NODE_FLAGS?.[part] ?? [])];
}

export async function stopChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM', graceMs = 5_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill(signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

/** utime+stime of a whole process (all threads, live and exited), in microseconds. */
export function cpuMicros(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1e6) / CLK_TCK;
}

/** USER_HZ: 100 on every Linux architecture Node runs on. */
export const CLK_TCK = 100;

export function rssBytes(pid: number): number {
  const m = /^VmRSS:\s+(\d+)\s+kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m?.[1]) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

export function sumOver(pids: readonly number[], f: (pid: number) => number): number {
  let total = 0;
  for (const pid of pids) total += f(pid);
  return total;
}

/** Direct children of `pid` (nginx workers of the master), by scanning /proc. */
export function childPids(pid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as AddressInfo;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

export async function waitForPort(port: number, timeoutMs = 10_000, host = '127.0.0.1'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((r) => {
      const s = connect({ port, host });
      s.once('connect', () => {
        s.destroy();
        r(true);
      });
      s.once('error', () => r(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listening on ${host}:${port} after ${timeoutMs} ms`);
    await sleep(50);
  }
}

/** Polls a log file until a line matches; returns the parsed JSON of that line. */
export async function waitForJsonLine<T>(path: string, pred: (v: Record<string, unknown>) => boolean, timeoutMs = 15_000, died?: () => string | undefined): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let text = '';
    try {
      text = readFileSync(path, 'utf8');
    } catch {
      // not created yet
    }
    for (const line of text.split('\n')) {
      if (!line.startsWith('{')) continue;
      try {
        const v = JSON.parse(line) as Record<string, unknown>;
        if (pred(v)) return v as T;
      } catch {
        // partial line
      }
    }
    const why = died?.();
    if (why) throw new Error(`${why}; log:\n${text.split('\n').slice(-15).join('\n')}`);
    if (Date.now() > deadline) throw new Error(`timed out waiting for a log line in ${path}:\n${text.split('\n').slice(-15).join('\n')}`);
    await sleep(50);
  }
}

/** Runs a command to completion and returns its stdout (stderr on failure in the error). */
export function run(cmd: string, args: string[], opts: SpawnOptions = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = track(spawn(cmd, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] }));
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}
