/** Ratios within each repetition, median (min–max) over repetitions, and the markdown report. */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import type { BenchOptions } from './args.js';
import type { AuditDrain } from './audit-drain.js';
import type { SlowReadResult } from './big.js';
import type { IdleStreamsResult } from './idle.js';
import type { PeerName } from './peers.js';
import { MAX_PROXY_STREAMS } from './proc.js';
import type { SseLatency } from './sse.js';
import { summarize, type Summary } from './stats.js';
import type { MachineInfo } from './tools.js';
import type { WrkResult } from './wrk.js';

type ByPeer<T> = Partial<Record<PeerName, T>>;

export interface RepResult {
  rep: number;
  /** Peer order used for each parameter (rotated per repetition and parameter). */
  order: Record<string, PeerName[]>;
  wrk: Record<string, ByPeer<WrkResult>>;
  sse: Record<string, ByPeer<SseLatency>>;
  ttfh: ByPeer<{ samplesMs: number[]; medianMs: number }>;
  big: ByPeer<SlowReadResult>;
  idle: Record<string, ByPeer<IdleStreamsResult>>;
  /** The cli-proxy's audit backlog after each cell that drove it, written before the next cell (charged to none). */
  drains?: Record<string, AuditDrain>;
  errors: string[];
}

export interface TargetResult {
  id: string;
  target: string;
  threshold: string;
  /** Per subject (forwarder, cli-proxy…): the per-repetition values summarized, and the verdict on the median. */
  bySubject: ByPeer<{ summary: Summary; met: boolean | undefined }>;
  reference: string;
}

export interface RunSummary {
  targets: TargetResult[];
  figures: {
    wrk: Record<string, ByPeer<{ rps: Summary; p50Ms: Summary; p99Ms: Summary; cpuUsPerReq: Summary; upstreamCpuUsPerReq: Summary }>>;
    sse: Record<string, ByPeer<{ p50Us: Summary; p99Us: Summary; addedP50Us: Summary; addedP99Us: Summary; cpuUsPerEvent?: Summary; cpuExactUsPerEvent?: Summary; cpuSteadyUsPerEvent?: Summary; cpuSteadyMainUsPerEvent?: Summary }>>;
    ttfh: ByPeer<{ ms: Summary; addedMs: Summary }>;
    big: ByPeer<{ growthMB: Summary; seconds: Summary }>;
    idle: Record<string, ByPeer<{ kbPerStream: Summary; openMs: Summary; upstreamConnectionsLeft: Summary }>>;
  };
}

export interface BenchResults {
  mode: string;
  machine: MachineInfo;
  loadGenerator: string;
  notes: string[];
  options: BenchOptions;
  peers: PeerName[];
  durationS: number;
  reps: RepResult[];
  summary: RunSummary;
}

// node-floor is judged too: where it misses a bound, no Node proxy of this shape meets it.
const SUBJECTS: PeerName[] = ['forwarder', 'forwarder-base', 'cli-proxy', 'node-floor'];

function perRep<T>(reps: RepResult[], f: (r: RepResult) => T | undefined): (T | undefined)[] {
  return reps.map((r) => {
    try {
      return f(r);
    } catch {
      return undefined;
    }
  });
}

const finite = (x: number | undefined): number | undefined => (x !== undefined && Number.isFinite(x) ? x : undefined);

export function summarizeRun(reps: RepResult[], opts: BenchOptions, peers: PeerName[]): RunSummary {
  const targets: TargetResult[] = [];
  const add = (id: string, target: string, threshold: string, limit: number, reference: string, value: (r: RepResult, p: PeerName) => number | undefined): void => {
    const bySubject: TargetResult['bySubject'] = {};
    for (const p of SUBJECTS) {
      if (!peers.includes(p)) continue;
      const summary = summarize(perRep(reps, (r) => finite(value(r, p))));
      bySubject[p] = { summary, met: summary.n ? summary.median <= limit : undefined };
    }
    targets.push({ id, target, threshold, bySubject, reference });
  };

  for (const c of opts.concurrency) {
    add(`cpu-c${c}`, `proxy CPU per 1 KB request, c=${c}`, '≤ 4× nginx', 4, 'ratio to nginx', (r, p) => {
      const mine = r.wrk[String(c)]?.[p]?.cpuUsPerReq;
      const ng = r.wrk[String(c)]?.nginx?.cpuUsPerReq;
      return mine !== undefined && ng ? mine / ng : undefined;
    });
  }
  if (opts.concurrency.includes(1)) {
    add('latency-c1', 'added p50 latency at concurrency 1', '≤ 0.15 ms over direct', 0.15, 'ms over direct', (r, p) => {
      const w = r.wrk['1'];
      const mine = w?.[p]?.p50Ms;
      const d = w?.direct?.p50Ms;
      return mine !== undefined && d !== undefined ? mine - d : undefined;
    });
  }
  const sseAdded = (r: RepResult, s: number, p: PeerName): number | undefined => {
    const row = r.sse[String(s)];
    const mine = row?.[p]?.p50Us;
    const d = row?.direct?.p50Us;
    return mine !== undefined && d !== undefined ? mine - d : undefined;
  };
  // Issue 23: at 32 and 256 streams within 1.2× nginx's per-event addition.
  for (const [s, limit] of [
    [1, 1.5],
    [32, 1.2],
    [256, 1.2],
  ] as const) {
    if (!opts.sseStreams.includes(s)) continue;
    add(`sse-${s}`, `SSE per-event added latency p50, ${s} stream${s > 1 ? 's' : ''}`, `≤ ${limit}× nginx's`, limit, 'ratio of added latencies to nginx', (r, p) => {
      const mine = sseAdded(r, s, p);
      const ng = sseAdded(r, s, 'nginx');
      // nginx's own addition at or below the clock noise makes a ratio meaningless.
      return mine !== undefined && ng !== undefined && ng > 1 ? mine / ng : undefined;
    });
  }
  for (const n of opts.idleStreams) {
    add(`idle-${n}`, `RSS per idle SSE stream at ${idleLabel(n)} streams`, '≤ 20 KB', 20, 'KB (1000 B) per stream', (r, p) => {
      const v = r.idle[String(n)]?.[p]?.bytesPerStream;
      return v !== undefined ? v / 1000 : undefined;
    });
  }
  add('big', `RSS growth, ${opts.bigMiB} MiB to a ${opts.bigRateMiB} MiB/s reader`, '≤ 16 MB', 16, 'MB (10⁶ B)', (r, p) => {
    const v = r.big[p]?.growth;
    return v !== undefined ? v / 1e6 : undefined;
  });
  add('ttfh', 'time to headers while the upstream is silent', 'within 5 ms of direct', 5, 'ms over direct (median of samples)', (r, p) => {
    const mine = r.ttfh[p]?.medianMs;
    const d = r.ttfh.direct?.medianMs;
    return mine !== undefined && d !== undefined ? mine - d : undefined;
  });

  const figures: RunSummary['figures'] = { wrk: {}, sse: {}, ttfh: {}, big: {}, idle: {} };
  for (const c of opts.concurrency) {
    const row: RunSummary['figures']['wrk'][string] = (figures.wrk[String(c)] = {});
    for (const p of peers) {
      const get = (f: (w: WrkResult) => number | undefined): Summary => summarize(perRep(reps, (r) => finite(f(r.wrk[String(c)]?.[p] as WrkResult))));
      row[p] = { rps: get((w) => w.rps), p50Ms: get((w) => w.p50Ms), p99Ms: get((w) => w.p99Ms), cpuUsPerReq: get((w) => w.cpuUsPerReq), upstreamCpuUsPerReq: get((w) => w.upstreamCpuUsPerReq) };
    }
  }
  for (const s of opts.sseStreams) {
    const row: RunSummary['figures']['sse'][string] = (figures.sse[String(s)] = {});
    for (const p of peers) {
      const sse = (r: RepResult): ByPeer<SseLatency> | undefined => r.sse[String(s)];
      row[p] = {
        p50Us: summarize(perRep(reps, (r) => sse(r)?.[p]?.p50Us)),
        p99Us: summarize(perRep(reps, (r) => sse(r)?.[p]?.p99Us)),
        addedP50Us: summarize(perRep(reps, (r) => sseAdded(r, s, p))),
        addedP99Us: summarize(
          perRep(reps, (r) => {
            const mine = sse(r)?.[p]?.p99Us;
            const d = sse(r)?.direct?.p99Us;
            return mine !== undefined && d !== undefined ? mine - d : undefined;
          }),
        ),
        cpuUsPerEvent: summarize(perRep(reps, (r) => sse(r)?.[p]?.cpuUsPerEvent)),
        cpuExactUsPerEvent: summarize(perRep(reps, (r) => sse(r)?.[p]?.cpuExactUsPerEvent)),
        cpuSteadyUsPerEvent: summarize(perRep(reps, (r) => sse(r)?.[p]?.cpuSteadyUsPerEvent)),
        cpuSteadyMainUsPerEvent: summarize(perRep(reps, (r) => sse(r)?.[p]?.cpuSteadyMainUsPerEvent)),
      };
    }
  }
  for (const p of peers) {
    figures.ttfh[p] = {
      ms: summarize(perRep(reps, (r) => r.ttfh[p]?.medianMs)),
      addedMs: summarize(
        perRep(reps, (r) => {
          const mine = r.ttfh[p]?.medianMs;
          const d = r.ttfh.direct?.medianMs;
          return mine !== undefined && d !== undefined ? mine - d : undefined;
        }),
      ),
    };
    figures.big[p] = {
      growthMB: summarize(perRep(reps, (r) => (r.big[p] ? (r.big[p] as SlowReadResult).growth / 1e6 : undefined))),
      seconds: summarize(perRep(reps, (r) => r.big[p]?.seconds)),
    };
  }
  for (const n of opts.idleStreams) {
    const row: RunSummary['figures']['idle'][string] = (figures.idle[String(n)] = {});
    for (const p of peers) {
      row[p] = {
        kbPerStream: summarize(perRep(reps, (r) => (r.idle[String(n)]?.[p] ? (r.idle[String(n)]?.[p] as IdleStreamsResult).bytesPerStream / 1000 : undefined))),
        openMs: summarize(perRep(reps, (r) => r.idle[String(n)]?.[p]?.openMs)),
        upstreamConnectionsLeft: summarize(perRep(reps, (r) => r.idle[String(n)]?.[p]?.upstreamConnectionsLeft)),
      };
    }
  }
  return { targets, figures };
}

/** `10,000`, or `10,000 (9,343 held)` when the fd limit capped the count. */
export function idleLabel(n: number): string {
  const held = Math.min(n, MAX_PROXY_STREAMS);
  return held === n ? n.toLocaleString('en-US') : `${n.toLocaleString('en-US')} (${held.toLocaleString('en-US')} held)`;
}

function fmtNum(x: number, digits: number): string {
  if (!Number.isFinite(x)) return '–';
  return x.toFixed(digits);
}

/** `median (min–max)`, or just the value for a single repetition. */
export function fmtSummary(s: Summary | undefined, digits = 2): string {
  if (!s || s.n === 0) return '–';
  if (s.n === 1) return fmtNum(s.median, digits);
  return `${fmtNum(s.median, digits)} (${fmtNum(s.min, digits)}–${fmtNum(s.max, digits)})`;
}

const verdict = (met: boolean | undefined): string => (met === undefined ? 'not measured' : met ? '**met**' : '**not met**');

export function renderMarkdown(res: BenchResults): string {
  const m = res.machine;
  const { targets, figures } = res.summary;
  const o = res.options;
  const peers = res.peers;
  const has = (p: PeerName): boolean => peers.includes(p);
  const lines: string[] = [];
  lines.push(
    `Run of ${m.date.slice(0, 16).replace('T', ' ')} UTC (${res.mode}, ${res.reps.length} repetition${res.reps.length > 1 ? 's' : ''}, ${Math.round(res.durationS)} s): ` +
      `${m.cpuModel}, ${m.cores} cores, ${m.memGiB} GiB, ${m.os}, kernel ${m.kernel}, Node ${m.node}, nginx ${m.nginx ?? 'absent'}, wrk ${m.wrk ?? 'absent'}; ` +
      `load average at start ${m.loadAvgAtStart.join(' / ')}; commit ${m.commit ?? '?'}${m.srcDirty ? ' with uncommitted changes in src/' : ''}.`,
    '',
    `Each figure is the median over repetitions with the (min–max) range; ratios and differences are taken within a repetition first.` +
      (o.concurrency.length === 0
        ? ''
        : ` Load generator for the JSON test: ${res.loadGenerator === 'wrk' ? 'wrk, 1 thread' : 'the Node load loop (wrk missing)'}; ${o.seconds} s per concurrency and peer.`),
  );
  for (const n of res.notes) lines.push('', `> ${n}`);
  lines.push('', '### Targets', '');
  const subjects = SUBJECTS.filter(has);
  lines.push(
    `| target | threshold | ${subjects.map((s) => `${s} | verdict | `).join('')}unit |`,
    `|---|---|${subjects.map(() => '---|---|').join('')}---|`,
  );
  for (const t of targets) {
    const cells = subjects.map((s) => {
      const v = t.bySubject[s];
      return `${fmtSummary(v?.summary)} | ${verdict(v?.met)}`;
    });
    lines.push(`| ${t.target} | ${t.threshold} | ${cells.join(' | ')} | ${t.reference} |`);
  }

  if (o.concurrency.length > 0) {
    lines.push('', `### 1 KB JSON POST (${res.loadGenerator})`, '', '| concurrency | peer | req/s | p50 ms | p99 ms | proxy CPU µs/req |', '|---|---|---|---|---|---|');
  }
  for (const c of o.concurrency) {
    for (const p of peers) {
      const f = figures.wrk[String(c)]?.[p];
      if (!f || f.rps.n === 0) continue;
      const cpu = p === 'direct' ? `(upstream server: ${fmtSummary(f.upstreamCpuUsPerReq, 0)})` : fmtSummary(f.cpuUsPerReq, 0);
      lines.push(`| ${c} | ${p} | ${fmtSummary(f.rps, 0)} | ${fmtSummary(f.p50Ms, 3)} | ${fmtSummary(f.p99Ms, 3)} | ${cpu} |`);
    }
  }

  lines.push('', `### SSE per-event latency (one event every ${o.sseIntervalMs} ms per stream up to 32 streams, then the same total rate: every ${o.sseIntervalMs * 8} ms at 256; ${o.sseSeconds} s)`, '', '| streams | peer | p50 µs | p99 µs | added p50 µs | added p99 µs | proxy CPU µs/event (utime+stime) | proxy runtime µs/event (schedstat) | steady: streams open and warm | steady, main thread |', '|---|---|---|---|---|---|---|---|---|---|');
  for (const s of o.sseStreams) {
    for (const p of peers) {
      const f = figures.sse[String(s)]?.[p];
      if (!f || f.p50Us.n === 0) continue;
      const added = p === 'direct';
      lines.push(
        `| ${s} | ${p} | ${fmtSummary(f.p50Us, 0)} | ${fmtSummary(f.p99Us, 0)} | ${added ? '–' : fmtSummary(f.addedP50Us, 0)} | ${added ? '–' : fmtSummary(f.addedP99Us, 0)} | ${added ? '–' : fmtSummary(f.cpuUsPerEvent, 1)} | ${added ? '–' : fmtSummary(f.cpuExactUsPerEvent, 1)} | ${added ? '–' : fmtSummary(f.cpuSteadyUsPerEvent, 1)} | ${added || p === 'nginx' ? '–' : fmtSummary(f.cpuSteadyMainUsPerEvent, 1)} |`,
      );
    }
  }

  const maxIdle = Math.max(...o.idleStreams);
  lines.push(
    '',
    '### Idle SSE streams and the large body',
    '',
    `| peer | time to headers, silent upstream, ms | added ms | ${o.idleStreams.map((n) => `KB/stream at ${idleLabel(n)} idle streams | `).join('')}upstream connections still open 3 s after the ${idleLabel(maxIdle)} clients left | RSS growth, ${o.bigMiB} MiB at ${o.bigRateMiB} MiB/s, MB |`,
    `|---|---|---|${o.idleStreams.map(() => '---|').join('')}---|---|`,
  );
  for (const p of peers) {
    if (p === 'forwarder-warn') continue;
    const t = figures.ttfh[p];
    const idle = o.idleStreams.map((n) => (p === 'direct' ? '–' : fmtSummary(figures.idle[String(n)]?.[p]?.kbPerStream, 1)));
    const left = p === 'direct' ? '–' : fmtSummary(figures.idle[String(maxIdle)]?.[p]?.upstreamConnectionsLeft, 0);
    lines.push(
      `| ${p} | ${fmtSummary(t?.ms, 2)} | ${p === 'direct' ? '–' : fmtSummary(t?.addedMs, 2)} | ${idle.join(' | ')} | ${left} | ${p === 'direct' ? '–' : fmtSummary(figures.big[p]?.growthMB, 1)} |`,
    );
  }
  const errors = res.reps.flatMap((r) => r.errors);
  if (errors.length) lines.push('', '### Errors during the run', '', ...errors.map((e) => `- ${e}`));
  return lines.join('\n');
}

export const DOCS_BEGIN = '<!-- bench:begin (generated by npm run bench; edit outside these markers) -->';
export const DOCS_END = '<!-- bench:end -->';

/** Replaces a generated block of docs/performance.md (the main one by default), keeping the hand-written rest. */
export function updateDocs(path: string, md: string, begin = DOCS_BEGIN, end = DOCS_END): void {
  const block = `${begin}\n${md}\n${end}`;
  const text = existsSync(path) ? readFileSync(path, 'utf8') : '';
  const b = text.indexOf(begin);
  const e = text.indexOf(end);
  if (b !== -1 && e > b) {
    writeFileSync(path, `${text.slice(0, b)}${block}${text.slice(e + end.length)}`);
  } else {
    writeFileSync(path, `# Performance\n\n## Latest results\n\n${block}\n${text ? `\n${text}` : ''}`);
  }
}
