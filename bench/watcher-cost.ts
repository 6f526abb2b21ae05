/**
 * `npm run bench -- --watcher`: what watching a directory of 10 000 token files costs
 * with chokidar (as hot-file configured it until the program kept one watcher) and with
 * `fs.watch` (as `watchDir` does). docs/performance.md, "File watching".
 *
 * The directory is laid out as <state>/mcp-forwarder/ is: `<id>.token` files (0600) and
 * `instances.json` beside them. Each run forks bench/lib/watcher-probe.js, which watches
 * and reports; this process writes. Per run: start time (until chokidar's `ready`; for
 * fs.watch until the call returns), RSS and inotify watches once started, CPU over 10 s
 * idle; then the registry replaced by atomic rename 100 times, one after another, each
 * waited for (latency: rename → the watcher's first callback naming it); then 1 000
 * token files rewritten back to back the same way and one more registry rename behind
 * them (its latency says how far behind the watcher fell). CPU of each phase is counted
 * until the probe has been quiet for 250 ms. Runs alternate the two watchers, 3 each.
 *
 * chokidar is not a dependency any more: the chokidar runs happen only where it can be
 * imported (`npm i --no-save chokidar@5` to measure it again) and are skipped otherwise.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readlinkSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { median } from './lib/stats.js';
import { sleep, track } from './lib/proc.js';
import type { ProbeKind, ProbeReply, ProbeRequest } from './lib/watcher-probe.js';

const REGISTRY = 'instances.json';
const PROBE = join(dirname(fileURLToPath(import.meta.url)), 'lib', 'watcher-probe.js');

export interface WatcherRun {
  kind: ProbeKind;
  startMs: number;
  rssMiB: number;
  inotifyWatches: number;
  idleCpuMsPer10s: number;
  renames: { count: number; missed: number; latencyMsMedian: number; latencyMsP90: number; latencyMsMax: number; cpuMs: number };
  tokens: { count: number; callbacks: number; registryLatencyMsAfter: number; cpuMs: number };
}

export interface WatcherFigures {
  files: number;
  loadavg1AtStart: number;
  runs: WatcherRun[];
  /** Medians over the runs of each watcher. */
  medians: Record<string, Omit<WatcherRun, 'kind'>>;
  skipped?: string;
}

class Probe {
  private waiters: Array<(reply: ProbeReply) => void> = [];
  private constructor(readonly child: ChildProcess) {
    child.on('message', (reply: ProbeReply) => {
      if (reply.type === 'failed') throw new Error(`watcher probe failed: ${reply.error}`);
      for (const w of this.waiters.splice(0)) w(reply);
    });
  }

  static start(kind: ProbeKind, dir: string): Probe {
    return new Probe(track(fork(PROBE, [kind, dir, REGISTRY], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] })));
  }

  next<T extends ProbeReply['type']>(type: T, timeoutMs = 120_000): Promise<Extract<ProbeReply, { type: T }> | undefined> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        resolve(undefined);
      }, timeoutMs);
      const waiter = (reply: ProbeReply): void => {
        if (reply.type !== type) return void this.waiters.push(waiter);
        clearTimeout(timer);
        resolve(reply as Extract<ProbeReply, { type: T }>);
      };
      this.waiters.push(waiter);
    });
  }

  request(msg: ProbeRequest): void {
    this.child.send(msg);
  }

  async usage(): Promise<Extract<ProbeReply, { type: 'usage' }>> {
    const reply = this.next('usage', 30_000);
    this.request({ type: 'usage' });
    const u = await reply;
    if (!u) throw new Error('the watcher probe did not answer');
    return u;
  }

  /** CPU (µs) once the probe has used none for 250 ms: the watcher has caught up. */
  async quietCpu(): Promise<number> {
    let last = (await this.usage()).cpuUs;
    for (let i = 0; i < 240; i++) {
      await sleep(250);
      const now = (await this.usage()).cpuUs;
      // The usage request itself costs a little; below 1 ms in 250 ms is quiet.
      if (now - last < 1_000) return now;
      last = now;
    }
    return last;
  }

  inotifyWatches(): number {
    const pid = this.child.pid;
    if (pid === undefined) return 0;
    let n = 0;
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`) !== 'anon_inode:inotify') continue;
        n += readFileSync(`/proc/${pid}/fdinfo/${fd}`, 'utf8').split('\n').filter((l) => l.startsWith('inotify wd:')).length;
      } catch {
        // the fd closed meanwhile
      }
    }
    return n;
  }

  async stop(): Promise<void> {
    const exited = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.request({ type: 'stop' });
    await Promise.race([exited, sleep(10_000)]);
    this.child.kill('SIGKILL');
  }
}

/** Replaces `name` in `dir` the way atomicWrite does (a dot temp renamed over it); returns the rename's time. */
function replace(dir: string, name: string, text: string): bigint {
  const tmp = join(dir, `.${name}.${process.pid}.${Math.random().toString(16).slice(2, 14)}.tmp`);
  writeFileSync(tmp, text, { mode: 0o600 });
  const at = process.hrtime.bigint();
  renameSync(tmp, join(dir, name));
  return at;
}

const ms = (ns: bigint): number => Number(ns) / 1e6;
const round = (x: number, digits = 1): number => Math.round(x * 10 ** digits) / 10 ** digits;

async function renameLatency(probe: Probe, dir: string, text: string): Promise<number | undefined> {
  const event = probe.next('event', 5_000);
  probe.request({ type: 'arm' });
  // The arm message is in the pipe before the rename; wait one turn so the probe has read it.
  await probe.usage();
  const at = replace(dir, REGISTRY, text);
  const got = await event;
  return got ? ms(BigInt(got.at) - at) : undefined;
}

async function oneRun(kind: ProbeKind, dir: string, tokenNames: string[], log: (line: string) => void): Promise<WatcherRun> {
  const probe = Probe.start(kind, dir);
  try {
    const ready = await probe.next('ready');
    if (!ready) throw new Error(`${kind}: the watcher was not ready within 120 s`);
    await sleep(1_000);
    const inotifyWatches = probe.inotifyWatches();
    const before = await probe.usage();
    await sleep(10_000);
    const idle = await probe.usage();

    const renameStart = idle.cpuUs;
    const latencies: number[] = [];
    let missed = 0;
    for (let i = 0; i < 100; i++) {
      const l = await renameLatency(probe, dir, `{"generation":${i}}\n`);
      if (l === undefined) missed++;
      else latencies.push(l);
    }
    const renameCpu = (await probe.quietCpu()) - renameStart;

    const tokenStart = await probe.usage();
    for (const name of tokenNames.slice(0, 1_000)) replace(dir, name, `token-${Math.random().toString(36).slice(2)}\n`);
    const after = await renameLatency(probe, dir, '{"generation":"after tokens"}\n');
    const tokenEnd = await probe.quietCpu();
    const tokenUsage = await probe.usage();

    latencies.sort((a, b) => a - b);
    const run: WatcherRun = {
      kind,
      startMs: round(ready.startMs),
      rssMiB: round(before.rss / 2 ** 20),
      inotifyWatches,
      idleCpuMsPer10s: round((idle.cpuUs - before.cpuUs) / 1000),
      renames: {
        count: 100,
        missed,
        latencyMsMedian: round(median(latencies), 2),
        latencyMsP90: round(latencies[Math.floor(latencies.length * 0.9)] ?? NaN, 2),
        latencyMsMax: round(latencies.at(-1) ?? NaN, 2),
        cpuMs: round(renameCpu / 1000),
      },
      tokens: {
        count: 1_000,
        callbacks: tokenUsage.tokenEvents - tokenStart.tokenEvents,
        registryLatencyMsAfter: round(after ?? NaN, 2),
        cpuMs: round((tokenEnd - tokenStart.cpuUs) / 1000),
      },
    };
    log(`watcher: ${JSON.stringify(run)}`);
    return run;
  } finally {
    await probe.stop();
  }
}

function chokidarMissing(): string | undefined {
  try {
    createRequire(import.meta.url).resolve('chokidar');
    return undefined;
  } catch {
    return 'chokidar is not installed (no longer a dependency): `npm i --no-save chokidar@5` to measure it';
  }
}

function medianRun(runs: WatcherRun[]): Omit<WatcherRun, 'kind'> {
  const m = (f: (r: WatcherRun) => number): number => round(median(runs.map(f)), 2);
  return {
    startMs: m((r) => r.startMs),
    rssMiB: m((r) => r.rssMiB),
    inotifyWatches: m((r) => r.inotifyWatches),
    idleCpuMsPer10s: m((r) => r.idleCpuMsPer10s),
    renames: {
      count: 100,
      missed: m((r) => r.renames.missed),
      latencyMsMedian: m((r) => r.renames.latencyMsMedian),
      latencyMsP90: m((r) => r.renames.latencyMsP90),
      latencyMsMax: m((r) => r.renames.latencyMsMax),
      cpuMs: m((r) => r.renames.cpuMs),
    },
    tokens: {
      count: 1_000,
      callbacks: m((r) => r.tokens.callbacks),
      registryLatencyMsAfter: m((r) => r.tokens.registryLatencyMsAfter),
      cpuMs: m((r) => r.tokens.cpuMs),
    },
  };
}

export async function runWatcherCost(log: (line: string) => void, opts: { files?: number; reps?: number } = {}): Promise<WatcherFigures> {
  const files = opts.files ?? 10_000;
  const root = mkdtempSync(join(tmpdir(), 'ac-bench-watcher-'));
  try {
    const dir = join(root, 'mcp-forwarder');
    mkdirSync(dir, { mode: 0o700 });
    const tokenNames = Array.from({ length: files }, (_, i) => `inst-bench-${String(i).padStart(5, '0')}.token`);
    for (const name of tokenNames) writeFileSync(join(dir, name), `token-${name}\n`, { mode: 0o600 });
    writeFileSync(join(dir, REGISTRY), '{}\n', { mode: 0o600 });
    const skipped = chokidarMissing();
    const kinds: ProbeKind[] = skipped ? ['fs.watch'] : ['chokidar', 'fs.watch'];
    const load = loadavg()[0] ?? NaN;
    const runs: WatcherRun[] = [];
    for (let rep = 0; rep < (opts.reps ?? 3); rep++) {
      for (const kind of kinds) {
        log(`watcher: ${kind} over ${files} token files, run ${rep + 1}`);
        runs.push(await oneRun(kind, dir, tokenNames, log));
      }
    }
    const medians = Object.fromEntries(kinds.map((k) => [k, medianRun(runs.filter((r) => r.kind === k))]));
    return { files, loadavg1AtStart: load, runs, medians, ...(skipped ? { skipped } : {}) };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}
