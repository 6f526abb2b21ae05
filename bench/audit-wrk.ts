/**
 * `npm run bench -- --audit-wrk`: what the native_cli audit costs the cli-proxy at wrk's
 * rates, where bench/audit-cost.ts paces 100 calls a second. Three cli-proxies against one
 * upstream, started fresh each repetition:
 *
 *   off    --no-audit
 *   on     the audit with a bound no run reaches (the link uploading: the usual host)
 *   full   the audit with a 1 000-event bound the warm-up fills (the link away, or a host
 *          never enrolled: every event first drops the oldest; the full bench's cli-proxy
 *          once it has answered 10 000 calls)
 *
 * For each concurrency the three take turns in rotated order: a wrk cell (the 1 KB JSON
 * POST of the full bench), then the wait until the cell's audit events are written
 * (bench/lib/audit-drain.ts). CPU per request is given in the cell alone (what the full
 * bench's table shows) and with the drain (the audit's whole cost: what the spool wrote
 * after the cell was paid for by the cell's calls).
 *
 * `--cpu-prof`: one repetition with each side under V8's profiler; prints the JS time of
 * the audit path by function (on the stack), as µs per request.
 */
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { readDroppedCount } from '../src/data/audit-event.js';
import type { BenchOptions } from './lib/args.js';
import { endpointsFor } from './full.js';
import { RESULTS_DIR } from './lib/paths.js';
import { newWorkDir, removeWorkDir, startPeer, UNREACHED_AUDIT_BOUND, type Peer } from './lib/peers.js';
import { CLK_TCK } from './lib/proc.js';
import { fmtSummary } from './lib/report.js';
import { summarize, type Summary } from './lib/stats.js';
import { ensureTools } from './lib/tools.js';
import { startUpstream } from './lib/upstream-ctl.js';
import { runWrk, writeWrkScript } from './lib/wrk.js';
import type { CpuProfile } from './profile.js';

export const AUDIT_SIDES = ['off', 'on', 'full'] as const;
export type AuditSide = (typeof AUDIT_SIDES)[number];

/** The `full` side's bound: small, so one warm-up fills it and every measured event drops one. */
const FULL_BOUND = 1_000;

interface Cell {
  requests: number;
  rps: number;
  /** Proxy CPU per request during the wrk run (/proc utime+stime), µs. */
  cpuUsPerReq: number;
  /** The same plus the CPU spent writing the cell's backlog after it, µs. */
  cpuWithDrainUsPerReq: number;
  /** Events still queued when wrk stopped, and how long they took to be written. */
  queuedAtEnd: number;
  drainMs: number;
}

export interface AuditWrkResults {
  date: string;
  cli: string;
  reps: number;
  seconds: number;
  concurrency: number[];
  loadAvgAtStart: number[];
  /** rep → `c=<n>` → side → cell. */
  cells: Array<Record<string, Partial<Record<AuditSide, Cell>>>>;
  summary: Record<string, Partial<Record<AuditSide, { cpuUsPerReq: Summary; cpuWithDrainUsPerReq: Summary; rps: Summary; drainMs: Summary; queuedAtEnd: Summary }>>>;
  /** Per audited side under --cpu-prof: function → µs per request with it on the JS stack. */
  profile?: Partial<Record<AuditSide, { requests: number; busyMs: number; rows: Array<{ name: string; usPerReq: number; pct: number }> }>>;
}

/** utime+stime of the process's main thread (the JS thread the profile samples), µs. */
function mainThreadCpu(p: Peer): number {
  const pid = p.pids()[0] as number;
  const stat = readFileSync(`/proc/${pid}/task/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1e6) / CLK_TCK;
}

function rotate<T>(xs: readonly T[], k: number): T[] {
  const s = k % xs.length;
  return [...xs.slice(s), ...xs.slice(0, s)];
}

/** The frames the audit path runs through: ours by file, the fs calls by name (what they cost in the kernel shows as their self time). */
const AUDIT_FILES = /\/(cli-proxy\/audit-spool|fs\/atomic-write|data\/audit-event|cli-proxy\/handler)\.js$/;
const FS_CALLS = /^(openSync|writeSync|fchmodSync|closeSync|renameSync|lstatSync|unlinkSync|readdir|unlink|fsync|open|rename|fstatSync)$/;

/**
 * Time with each audit-path function anywhere on the stack (a parent includes its
 * children), as a share of the busy samples: a row's µs/request is that share times the
 * process CPU per request, as bench/profile.ts does (samples are wall-clock spaced).
 */
export function auditPathOnStack(p: CpuProfile): { busyMs: number; byFunction: Map<string, number> } {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const byFunction = new Map<string, number>();
  let busy = 0;
  for (let i = 0; i < p.samples.length; i++) {
    const id = p.samples[i] as number;
    const ms = (p.timeDeltas[i + 1] ?? 0) / 1000;
    const leaf = byId.get(id);
    if (!leaf || leaf.callFrame.functionName === '(idle)') continue;
    busy += ms;
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const f = byId.get(cur)?.callFrame;
      if (!f) continue;
      const file = AUDIT_FILES.exec(f.url)?.[1];
      const name = file
        ? `${f.functionName || '(anonymous)'} (${file}.js)`
        : FS_CALLS.test(f.functionName) && f.url.startsWith('node:')
          ? `fs ${f.functionName}`
          : f.url.includes('/node_modules/zod/')
            ? 'zod (the event\'s schema check)'
            : undefined;
      if (name) seen.add(name);
    }
    if (leaf.callFrame.functionName === '(garbage collector)') seen.add('(garbage collector)');
    for (const n of seen) byFunction.set(n, (byFunction.get(n) ?? 0) + ms);
  }
  return { busyMs: busy, byFunction };
}

export interface AuditWrkOptions {
  /** One repetition under V8's profiler. */
  cpuProf: boolean;
  /** Where the spools go (default: the run's temp directory); removed at the end. */
  spoolDir?: string | undefined;
}

export async function runAuditWrk(opts: BenchOptions, log: (s: string) => void, { cpuProf, spoolDir }: AuditWrkOptions): Promise<AuditWrkResults> {
  const tools = await ensureTools(opts.install, log);
  if (!tools.wrk) throw new Error('--audit-wrk needs wrk');
  const work = newWorkDir();
  const spoolRoot = spoolDir ? mkdtempSync(join(spoolDir, 'ac-audit-wrk-')) : work;
  const script = writeWrkScript(work);
  const upstream = await startUpstream(AUDIT_SIDES.length);
  const reps = cpuProf ? 1 : opts.reps;
  const results: AuditWrkResults = {
    date: new Date().toISOString(),
    cli: opts.cli,
    reps,
    seconds: opts.seconds,
    concurrency: opts.concurrency,
    loadAvgAtStart: (await import('node:os')).loadavg(),
    cells: [],
    summary: {},
  };
  /** Per side under --cpu-prof: every request it answered (warm-up included: the profile covers it) and its main thread's CPU meanwhile. */
  const profiles: Partial<Record<AuditSide, { dir: string; requests: number; mainCpuUs: number; mainCpu0: number }>> = {};
  try {
    for (let rep = 0; rep < reps; rep++) {
      const peers = new Map<AuditSide, Peer>();
      const spools = new Map<AuditSide, string>();
      try {
        for (const [i, side] of AUDIT_SIDES.entries()) {
          const spool = join(spoolRoot, `audit-${side}-${rep}`);
          spools.set(side, spool);
          const prof = join(work, `prof-${side}`);
          if (cpuProf) mkdirSync(prof, { recursive: true });
          peers.set(
            side,
            await startPeer('cli-proxy', {
              cli: opts.cli,
              upstreamPort: upstream.ports[i] as number,
              endpoints: endpointsFor(opts),
              workDir: work,
              nodeArgs: cpuProf ? ['--cpu-prof', '--cpu-prof-dir', prof, '--cpu-prof-interval', '200'] : [],
              extraArgs: side === 'off' ? ['--no-audit'] : ['--audit-dir', spool, '--audit-max-events', String(side === 'full' ? FULL_BOUND : UNREACHED_AUDIT_BOUND)],
            }),
          );
          if (cpuProf) profiles[side] = { dir: prof, requests: 0, mainCpuUs: 0, mainCpu0: mainThreadCpu(peers.get(side) as Peer) };
        }
        // Warm-up: JIT, connections, the spool directory; the full side until its bound is reached.
        for (const side of AUDIT_SIDES) {
          const p = peers.get(side) as Peer;
          for (let k = 0; k < 10; k++) {
            const w = await runWrk({ url: p.url('json'), script, connections: 16, seconds: 1, pids: p.pids(), upstreamPid: upstream.pid });
            await p.auditDrained();
            const prof = profiles[side];
            if (prof) prof.requests += w.requests;
            if (side !== 'full' || (await readDroppedCount(spools.get(side) as string)) > 0) break;
          }
        }
        const row: AuditWrkResults['cells'][number] = {};
        results.cells.push(row);
        for (const [ci, c] of opts.concurrency.entries()) {
          const cells: Partial<Record<AuditSide, Cell>> = (row[`c=${c}`] = {});
          for (const side of rotate(AUDIT_SIDES, rep + ci)) {
            const p = peers.get(side) as Peer;
            const r = await runWrk({ url: p.url('json'), script, connections: c, seconds: opts.seconds, pids: p.pids(), upstreamPid: upstream.pid });
            const d = await p.auditDrained();
            const cpu = r.cpuUsPerReq as number;
            const cell: Cell = {
              requests: r.requests,
              rps: r.rps,
              cpuUsPerReq: cpu,
              cpuWithDrainUsPerReq: cpu + (d?.cpuUs ?? 0) / r.requests,
              queuedAtEnd: d?.queued ?? 0,
              drainMs: d?.ms ?? 0,
            };
            cells[side] = cell;
            const prof = profiles[side];
            if (prof) prof.requests += r.requests;
            if (d && !d.drained) log(`  WARNING ${side}: ${d.left} events still queued after ${(d.ms / 1000).toFixed(0)} s`);
            log(
              `  rep ${rep + 1} c=${c} audit ${side}: ${r.rps.toFixed(0)} req/s, CPU ${cpu.toFixed(0)} µs/req in the cell, ${cell.cpuWithDrainUsPerReq.toFixed(0)} with the drain` +
                ` (${cell.queuedAtEnd} queued at the end, written in ${(cell.drainMs / 1000).toFixed(2)} s)`,
            );
          }
        }
      } finally {
        for (const [side, p] of peers) {
          const prof = profiles[side];
          if (prof) prof.mainCpuUs = mainThreadCpu(p) - prof.mainCpu0;
          await p.stop();
        }
      }
    }
  } finally {
    await upstream.stop();
  }
  for (const c of opts.concurrency) {
    const key = `c=${c}`;
    results.summary[key] = {};
    for (const side of AUDIT_SIDES) {
      const of = (f: (x: Cell) => number): Summary => summarize(results.cells.map((r) => { const x = r[key]?.[side]; return x ? f(x) : undefined; }));
      (results.summary[key] as NonNullable<AuditWrkResults['summary'][string]>)[side] = {
        cpuUsPerReq: of((x) => x.cpuUsPerReq),
        cpuWithDrainUsPerReq: of((x) => x.cpuWithDrainUsPerReq),
        rps: of((x) => x.rps),
        drainMs: of((x) => x.drainMs),
        queuedAtEnd: of((x) => x.queuedAtEnd),
      };
    }
  }
  if (cpuProf) {
    results.profile = {};
    mkdirSync(RESULTS_DIR, { recursive: true });
    const stamp = results.date.replace(/[:.]/g, '-');
    for (const side of AUDIT_SIDES) {
      const prof = profiles[side];
      const file = prof && readdirSync(prof.dir).find((f) => f.endsWith('.cpuprofile'));
      if (!prof || !file) continue;
      copyFileSync(join(prof.dir, file), resolve(RESULTS_DIR, `cli-proxy-audit-${side}-${stamp}.cpuprofile`));
      const { busyMs, byFunction } = auditPathOnStack(JSON.parse(readFileSync(join(prof.dir, file), 'utf8')) as CpuProfile);
      // Shares of the JS thread's samples × its CPU per request: the profile sees that thread only.
      const perReq = prof.mainCpuUs / prof.requests;
      results.profile[side] = {
        requests: prof.requests,
        busyMs: Math.round(busyMs),
        rows: [...byFunction]
          .sort((a, b) => b[1] - a[1])
          .map(([name, ms]) => ({ name, pct: Math.round((ms / busyMs) * 1000) / 10, usPerReq: Math.round((ms / busyMs) * perReq * 10) / 10 })),
      };
    }
    log(`profiles: ${RESULTS_DIR}/cli-proxy-audit-*-${stamp}.cpuprofile`);
  }
  removeWorkDir(work);
  if (spoolRoot !== work) removeWorkDir(spoolRoot);
  mkdirSync(RESULTS_DIR, { recursive: true });
  const out = opts.out ? resolve(opts.out) : resolve(RESULTS_DIR, `audit-wrk-${results.date.replace(/[:.]/g, '-')}.json`);
  writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
  log(`results: ${out}`);
  return results;
}

export function auditWrkMarkdown(r: AuditWrkResults): string {
  const lines = [
    `| concurrency | audit | req/s | CPU µs/req in the cell | CPU µs/req with the drain | queued at the cell's end | drain s |`,
    '|---|---|---|---|---|---|---|',
  ];
  for (const c of r.concurrency) {
    for (const side of AUDIT_SIDES) {
      const s = r.summary[`c=${c}`]?.[side];
      if (!s) continue;
      lines.push(`| ${c} | ${side} | ${fmtSummary(s.rps, 0)} | ${fmtSummary(s.cpuUsPerReq, 0)} | ${fmtSummary(s.cpuWithDrainUsPerReq, 0)} | ${fmtSummary(s.queuedAtEnd, 0)} | ${fmtSummary({ ...s.drainMs, median: s.drainMs.median / 1000, min: s.drainMs.min / 1000, max: s.drainMs.max / 1000 }, 2)} |`);
    }
  }
  for (const [side, p] of Object.entries(r.profile ?? {})) {
    lines.push('', `#### audit ${side}: JS time with each function on the stack (${p.requests} requests, ${p.busyMs} ms of busy samples)`, '', '| function | % of busy samples | ≈ µs/request |', '|---|---|---|');
    for (const row of p.rows.slice(0, 25)) lines.push(`| \`${row.name}\` | ${row.pct} | ${row.usPerReq.toFixed(1)} |`);
  }
  return lines.join('\n');
}
