/**
 * `npm run bench -- --profile`: the forwarder under wrk load (c=16) with `--cpu-prof`,
 * then where its CPU time goes: self time by function, and time with each package,
 * Node module or forwarder file on the stack. The .cpuprofile is kept in bench/results/
 * (open it in Chrome DevTools or speedscope for a flame graph).
 */
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { BenchOptions } from './lib/args.js';
import { endpointsFor } from './full.js';
import { nodeLoad } from './lib/load.js';
import { RESULTS_DIR } from './lib/paths.js';
import { newWorkDir, removeWorkDir, startPeer } from './lib/peers.js';
import { freePort } from './lib/proc.js';
import { ensureTools } from './lib/tools.js';
import { startUpstream } from './lib/upstream-ctl.js';
import { runWrk, writeWrkScript } from './lib/wrk.js';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
export interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileRow {
  name: string;
  ms: number;
  pct: number;
}

export interface ProfileSummary {
  totalMs: number;
  requests: number;
  /** Process CPU per request over the profiled run, from /proc (µs); rows' µs/request are shares of it. */
  cpuUsPerReq: number | undefined;
  selfByFunction: ProfileRow[];
  selfByGroup: ProfileRow[];
  onStackByGroup: ProfileRow[];
}

/** The package, Node module or project file a frame belongs to. */
export function groupOf(f: CallFrame): string {
  if (!f.url) return f.functionName || '(anonymous)';
  const nm = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(f.url);
  if (nm?.[1]) return nm[1];
  if (f.url.startsWith('node:')) return f.url;
  const dist = /\/dist\/(.*)$/.exec(f.url);
  if (dist?.[1]) return `dist/${dist[1]}`;
  return f.url;
}

export function analyseProfile(p: CpuProfile, requests: number, cpuUsPerReq: number | undefined): ProfileSummary {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<number, number>();
  for (let i = 0; i < p.samples.length; i++) {
    const id = p.samples[i] as number;
    const dt = (p.timeDeltas[i + 1] ?? 0) / 1000; // the delta after a sample is its duration, ms
    self.set(id, (self.get(id) ?? 0) + dt);
  }
  let total = 0;
  const fn = new Map<string, number>();
  const group = new Map<string, number>();
  const onStack = new Map<string, number>();
  for (const [id, ms] of self) {
    const n = byId.get(id);
    if (!n) continue;
    const f = n.callFrame;
    if (f.functionName === '(idle)') continue;
    total += ms;
    const key = `${f.functionName || '(anonymous)'} ${f.url ? `${groupOf(f)}:${f.lineNumber + 1}` : ''}`.trim();
    fn.set(key, (fn.get(key) ?? 0) + ms);
    group.set(groupOf(f), (group.get(groupOf(f)) ?? 0) + ms);
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const node = byId.get(cur);
      if (!node || node.callFrame.functionName === '(root)') continue;
      seen.add(groupOf(node.callFrame));
    }
    for (const g of seen) onStack.set(g, (onStack.get(g) ?? 0) + ms);
  }
  const rows = (m: Map<string, number>, n: number): ProfileRow[] =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, ms]) => ({ name, ms: Math.round(ms), pct: Math.round((ms / total) * 1000) / 10 }));
  return { totalMs: Math.round(total), requests, cpuUsPerReq, selfByFunction: rows(fn, 30), selfByGroup: rows(group, 25), onStackByGroup: rows(onStack, 25) };
}

export function renderProfile(s: ProfileSummary): string {
  // Samples are wall-clock spaced: on a busy host, time the thread waited for a core counts
  // as busy. So a row's µs/request is its share of the busy samples times the CPU per
  // request measured from /proc, not its sampled milliseconds / requests.
  const perReq = s.cpuUsPerReq ?? (s.totalMs * 1000) / s.requests;
  const table = (title: string, rows: ProfileRow[]): string[] => [
    '',
    `#### ${title}`,
    '',
    '| | % of busy samples | ≈ µs/request |',
    '|---|---|---|',
    ...rows.map((r) => `| \`${r.name.replace(/\|/g, '\\|')}\` | ${r.pct} | ${((r.pct / 100) * perReq).toFixed(1)} |`),
  ];
  return [
    `Forwarder CPU profile (JS thread, sampled): ${s.totalMs} ms of busy samples over ${s.requests} requests; ` +
      `process CPU ${s.cpuUsPerReq === undefined ? 'not measured' : `${s.cpuUsPerReq.toFixed(0)} µs/request`} (from /proc, with the profiler's overhead).`,
    ...table('Self time by group (package, Node module, project file)', s.selfByGroup),
    ...table('Time with the group anywhere on the stack', s.onStackByGroup),
    ...table('Self time by function', s.selfByFunction),
  ].join('\n');
}

/** `withMetrics`: the forwarder serves metrics (`--with-metrics`), to see what they add to the profile. */
export async function runProfile(opts: BenchOptions, log: (s: string) => void, withMetrics = false): Promise<ProfileSummary> {
  const tools = await ensureTools(opts.install, log);
  const work = newWorkDir();
  const profDir = join(work, 'prof');
  mkdirSync(profDir);
  const upstream = await startUpstream(1);
  try {
    const fwd = await startPeer('forwarder', {
      cli: opts.cli,
      upstreamPort: upstream.ports[0] as number,
      endpoints: endpointsFor(opts),
      workDir: work,
      nodeArgs: ['--cpu-prof', '--cpu-prof-dir', profDir, '--cpu-prof-interval', '200'],
      extraArgs: withMetrics ? ['--metrics-listen', `127.0.0.1:${await freePort()}`] : [],
    });
    const seconds = Math.max(opts.seconds, 5);
    // One --concurrency value profiles at that load; the default list means c=16.
    const connections = opts.concurrency.length === 1 ? (opts.concurrency[0] as number) : 16;
    let requests: number;
    let cpuUsPerReq: number | undefined;
    if (tools.wrk) {
      const script = writeWrkScript(work);
      const warm = await runWrk({ url: fwd.url('json'), script, connections, seconds: 1, pids: fwd.pids(), upstreamPid: upstream.pid });
      const r = await runWrk({ url: fwd.url('json'), script, connections, seconds, pids: fwd.pids(), upstreamPid: upstream.pid });
      requests = warm.requests + r.requests; // the profile covers the warm-up too
      cpuUsPerReq = r.cpuUsPerReq;
      log(`profiled run at c=${connections}: ${r.rps.toFixed(0)} req/s, proxy CPU ${r.cpuUsPerReq?.toFixed(0)} µs/req (with profiler overhead)`);
    } else {
      const r = await nodeLoad(fwd.url('json'), connections, seconds * 1000, fwd.pids());
      requests = r.requests;
      cpuUsPerReq = r.cpuUsPerReq;
    }
    await fwd.stop();
    const file = readdirSync(profDir).find((f) => f.endsWith('.cpuprofile'));
    if (!file) throw new Error('the forwarder wrote no .cpuprofile (did it exit cleanly on SIGTERM?)');
    const summary = analyseProfile(JSON.parse(readFileSync(join(profDir, file), 'utf8')) as CpuProfile, requests, cpuUsPerReq);
    mkdirSync(RESULTS_DIR, { recursive: true });
    const stamp = new Date().toISOString().replace(/[:.]/g, '-');
    const kept = resolve(RESULTS_DIR, `forwarder-${stamp}.cpuprofile`);
    copyFileSync(join(profDir, file), kept);
    writeFileSync(resolve(RESULTS_DIR, `profile-${stamp}.json`), `${JSON.stringify(summary, null, 2)}\n`);
    process.stdout.write(`${renderProfile(summary)}\n`);
    log(`profile: ${kept}`);
    return summary;
  } finally {
    await upstream.stop();
    removeWorkDir(work);
  }
}
