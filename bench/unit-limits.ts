/**
 * `npm run bench -- --limits`: what each part needs of the three unit limits
 * (`MemoryMax=`, `LimitNOFILE=`, `TasksMax=`, docs/units.md), idle and under a heavy but
 * legitimate load, so the limits are chosen from figures and can be re-measured.
 *
 * Each part is the real CLI process; a figure covers its whole process tree, as the
 * unit's cgroup counts it (the forwarder's and cli-proxy's perl sock_diag helper, the
 * systemd-notify children): RSS summed (MemoryMax= charges every process of the unit),
 * open descriptors of the main process (RLIMIT_NOFILE is per process), tasks (threads of
 * every process: TasksMax= counts them). Peaks are sampled every 100 ms during each load.
 *
 * Loads (each the heaviest a host of this product should see in normal use):
 * - forwarder: 1 000 idle SSE streams held open while 100 clients send JSON-RPC calls back
 *   to back for 10 s;
 * - cli-proxy: the same (a burst of CLI calls from 100 agents at once, 1 000 held open);
 * - link and apply: a desired state of 10 000 bindings taken whole, applied, and the new
 *   slots renewed (the link's renewals and presence over 10 000 slot files).
 *
 * Not a test: it asserts nothing; it prints figures (JSON, then a Markdown table).
 */
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { holdIdleStreams } from './lib/idle.js';
import { nodeLoad } from './lib/load.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { newWorkDir, removeWorkDir, startPeer, type Peer } from './lib/peers.js';
import { childPids, sleep, spawnTracked, stopChild, waitForJsonLine } from './lib/proc.js';
import { startUpstream, type Upstream } from './lib/upstream-ctl.js';

const HOST_ID = 'host-limits-bench';

export interface TreeFigures {
  rssMiB: number;
  fds: number;
  tasks: number;
}

/** The process and every descendant. */
function tree(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) out.push(...childPids(out[i] as number));
  return out;
}

function statusField(pid: number, field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+)`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return Number(m?.[1] ?? 0);
  } catch {
    return 0; // gone meanwhile
  }
}

function fdCount(pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return 0;
  }
}

export function treeFigures(pid: number): TreeFigures {
  const pids = tree(pid);
  const rssKb = pids.reduce((a, p) => a + statusField(p, 'VmRSS'), 0);
  return { rssMiB: Math.round((rssKb / 1024) * 10) / 10, fds: fdCount(pid), tasks: pids.reduce((a, p) => a + statusField(p, 'Threads'), 0) };
}

/** Samples a process tree every 100 ms while `work` runs; the peak of each figure. */
async function peakDuring<T>(pids: number[], work: () => Promise<T>): Promise<{ result: T; peaks: TreeFigures[] }> {
  const peaks = pids.map(() => ({ rssMiB: 0, fds: 0, tasks: 0 }));
  const sample = (): void =>
    pids.forEach((pid, i) => {
      const f = treeFigures(pid);
      const p = peaks[i] as TreeFigures;
      p.rssMiB = Math.max(p.rssMiB, f.rssMiB);
      p.fds = Math.max(p.fds, f.fds);
      p.tasks = Math.max(p.tasks, f.tasks);
    });
  sample();
  const timer = setInterval(sample, 100);
  try {
    const result = await work();
    sample();
    return { result, peaks };
  } finally {
    clearInterval(timer);
  }
}

export interface LimitsOptions {
  cli?: string;
  streams?: number;
  callers?: number;
  burstMs?: number;
  bindings?: number;
  /** How long the renewals of the new slots are watched after the state is applied. */
  renewWatchMs?: number;
}

async function proxyFigures(log: (l: string) => void, peer: Peer, name: string, o: Required<LimitsOptions>): Promise<Record<string, unknown>> {
  const pid = peer.pids()[0] as number;
  await sleep(3_000);
  const idle = treeFigures(pid);
  log(`${name}: idle ${JSON.stringify(idle)}; ${o.streams} idle streams + ${o.callers} callers for ${o.burstMs / 1000} s`);
  const { result, peaks } = await peakDuring([pid], () =>
    Promise.all([holdIdleStreams(peer.url('idle'), o.streams, [pid], o.burstMs + 2_000), sleep(1_000).then(() => nodeLoad(peer.url('json'), o.callers, o.burstMs, [pid]))]),
  );
  const [, load] = result;
  log(`${name}: peak ${JSON.stringify(peaks[0])}; ${load.requests} calls, ${load.bad} bad`);
  return { idle, peak: peaks[0], calls: load.requests, bad: load.bad, rps: load.rps };
}

async function linkApplyFigures(log: (l: string) => void, cli: string, o: Required<LimitsOptions>): Promise<Record<string, unknown>> {
  const dir = newWorkDir();
  const state = join(dir, 'state');
  const handoff = join(state, 'handoff');
  for (const d of [join(handoff, 'inbox'), join(handoff, 'slots'), join(state, 'mcp-forwarder'), join(state, 'cli-proxy')]) mkdirSync(d, { recursive: true, mode: 0o700 });
  const credential = `hostcred-limits-${Math.random().toString(36).slice(2)}${Date.now()}`;
  const credentialFile = join(dir, 'host-credential');
  writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
  const gw = await MockHostGateway.start({ staticHosts: { [HOST_ID]: credential }, tokenLifetimeMs: 6 * 3600_000 });
  const env = { ...process.env };
  delete env.NOTIFY_SOCKET;
  delete env.WATCHDOG_USEC;
  const start = (name: string, args: string[]) => {
    const logPath = join(dir, `${name}.log`);
    const child = spawnTracked('sh', ['-c', `exec "$0" "$@" >>${logPath} 2>&1`, process.execPath, cli, ...args, '--log-level', 'info'], { stdio: 'ignore', env, cwd: dir });
    return { child, logPath, pid: child.pid as number };
  };
  try {
    const apply = start('apply', ['renew', 'apply', '--watch', '--state-dir', state, '--handoff', handoff, '--shim-dir', join(dir, 'shims')]);
    await waitForJsonLine(apply.logPath, (l) => l.msg === 'apply watching', 30_000);
    // prettier-ignore
    const link = start('link', ['link', '--gateway', gw.url, '--credential', credentialFile, '--handoff', handoff, '--state-dir', state, '--host-id', HOST_ID,
      '--forwarder-health', 'http://127.0.0.1:9/healthz', '--cli-proxy-health', 'http://127.0.0.1:9/healthz']);
    const applied = join(handoff, 'applied-state.json');
    const appliedVersion = (): number => {
      try {
        const v = JSON.parse(readFileSync(applied, 'utf8')) as { version?: number; appliedAt?: string | null };
        return v.appliedAt ? (v.version ?? -1) : -1;
      } catch {
        return -1;
      }
    };
    const waitFor = async (ok: () => boolean, timeoutMs: number): Promise<boolean> => {
      const end = Date.now() + timeoutMs;
      while (!ok()) {
        if (Date.now() > end) return false;
        await sleep(200);
      }
      return true;
    };
    await waitFor(() => appliedVersion() === gw.control.version, 60_000);
    await sleep(3_000);
    const idle = { link: treeFigures(link.pid), apply: treeFigures(apply.pid) };
    log(`link/apply: idle ${JSON.stringify(idle)}; a desired state of ${o.bindings} bindings`);
    const tokens = (): number => readdirSync(join(state, 'mcp-forwarder')).filter((f) => f.endsWith('.token')).length;
    const t0 = Date.now();
    const { result, peaks } = await peakDuring([link.pid, apply.pid], async () => {
      gw.control.connectBindings(
        Object.fromEntries(Array.from({ length: o.bindings }, (_, i) => [`bind_lim_${String(i).padStart(6, '0')}`, { instanceId: `lim-${i}`, upstreamUrl: `http://127.0.0.1:9/mcp/${i}` }])),
      );
      const version = gw.control.version;
      const appliedOk = await waitFor(() => appliedVersion() === version, 900_000);
      const appliedS = Math.round((Date.now() - t0) / 1000);
      log(`link/apply: applied ${appliedOk} after ${appliedS} s; watching renewals ${o.renewWatchMs / 1000} s`);
      await waitFor(() => tokens() >= o.bindings, o.renewWatchMs);
      return { appliedS, tokens: tokens() };
    });
    log(`link/apply: peak link ${JSON.stringify(peaks[0])} apply ${JSON.stringify(peaks[1])}; ${result.tokens} tokens`);
    await Promise.all([stopChild(link.child), stopChild(apply.child)]);
    return { idle, peak: { link: peaks[0], apply: peaks[1] }, bindings: o.bindings, ...result };
  } finally {
    await gw.close();
    removeWorkDir(dir);
  }
}

export async function runUnitLimits(log: (l: string) => void, options: LimitsOptions = {}): Promise<Record<string, unknown>> {
  const o: Required<LimitsOptions> = {
    cli: options.cli ?? DEFAULT_CLI,
    streams: options.streams ?? 1_000,
    callers: options.callers ?? 100,
    burstMs: options.burstMs ?? 10_000,
    bindings: options.bindings ?? 10_000,
    renewWatchMs: options.renewWatchMs ?? 120_000,
  };
  const out: Record<string, unknown> = { streams: o.streams, callers: o.callers, burstMs: o.burstMs };
  const work = newWorkDir();
  let upstream: Upstream | undefined;
  const peers: Peer[] = [];
  try {
    upstream = await startUpstream(1);
    const endpoints = { json: '/mcp', idle: '/idle' };
    for (const name of ['forwarder', 'cli-proxy'] as const) {
      const peer = await startPeer(name, { cli: o.cli, upstreamPort: upstream.ports[0] as number, endpoints, workDir: work });
      peers.push(peer);
      out[name] = await proxyFigures(log, peer, name, o);
      await peer.stop();
    }
  } finally {
    for (const p of peers) await p.stop().catch(() => undefined);
    await upstream?.stop();
    removeWorkDir(work);
  }
  out.linkApply = await linkApplyFigures(log, o.cli, o);
  return out;
}

export function limitsMarkdown(r: Record<string, unknown>): string {
  const row = (part: string, idle: TreeFigures | undefined, peak: TreeFigures | undefined): string =>
    `| ${part} | ${idle?.rssMiB ?? '?'} MiB / ${idle?.fds ?? '?'} / ${idle?.tasks ?? '?'} | ${peak?.rssMiB ?? '?'} MiB / ${peak?.fds ?? '?'} / ${peak?.tasks ?? '?'} |`;
  const p = (k: string) => r[k] as { idle?: TreeFigures; peak?: TreeFigures } | undefined;
  const la = r.linkApply as { idle?: { link: TreeFigures; apply: TreeFigures }; peak?: { link: TreeFigures; apply: TreeFigures } } | undefined;
  return [
    '| part | idle: RSS / fds / tasks | under load: RSS / fds / tasks (peak) |',
    '|---|---|---|',
    row('forwarder', p('forwarder')?.idle, p('forwarder')?.peak),
    row('cli-proxy', p('cli-proxy')?.idle, p('cli-proxy')?.peak),
    row('link', la?.idle?.link, la?.peak?.link),
    row('renew-apply', la?.idle?.apply, la?.peak?.apply),
  ].join('\n');
}
