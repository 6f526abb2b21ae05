/**
 * The full (and quick) run: repetition → parameter → peers in rotated order. Peers are
 * started fresh for each repetition, each against its own upstream port; the upstream
 * process lives for the whole run.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import type { BenchOptions } from './lib/args.js';
import { AUDIT_DRAIN_BOUND_MS, type AuditDrain } from './lib/audit-drain.js';
import { slowRead, type SlowReadResult } from './lib/big.js';
import { holdIdleStreams, timeToHeaders, type IdleStreamsResult } from './lib/idle.js';
import { nodeLoad } from './lib/load.js';
import { DOCS_FILE, RESULTS_DIR } from './lib/paths.js';
import { newWorkDir, removeWorkDir, startPeer, type Peer, type PeerName } from './lib/peers.js';
import { MAX_PROXY_STREAMS, NOFILE, sleep } from './lib/proc.js';
import { renderMarkdown, summarizeRun, updateDocs, type BenchResults, type RepResult } from './lib/report.js';
import { measureSse } from './lib/sse.js';
import { median } from './lib/stats.js';
import { ensureTools, machineInfo } from './lib/tools.js';
import { startUpstream, type Upstream } from './lib/upstream-ctl.js';
import { runWrk, writeWrkScript, type WrkResult } from './lib/wrk.js';

const MiB = 1024 * 1024;
const SSE_WARM_EVENTS = 20;

function rotate<T>(xs: readonly T[], k: number): T[] {
  if (xs.length === 0) return [];
  const s = k % xs.length;
  return [...xs.slice(s), ...xs.slice(0, s)];
}

/**
 * Each stream's event interval: `--sse-interval-ms` up to 32 streams, then longer so the
 * whole run carries 32 streams' event rate (3 200 events/s at 10 ms). At 256 streams × 10 ms
 * the 2-core machine (upstream, proxy and client all Node) would saturate, and the figure
 * would be queueing, not what one event costs with many streams open.
 */
export function sseIntervalFor(opts: BenchOptions, streams: number): number {
  return Math.round(opts.sseIntervalMs * Math.max(1, streams / 32));
}

function sseCountFor(opts: BenchOptions, interval: number): number {
  return SSE_WARM_EVENTS + Math.round((opts.sseSeconds * 1000) / interval);
}

export function endpointsFor(opts: BenchOptions): Record<string, string> {
  const sse = Object.fromEntries(
    opts.sseStreams.map((s) => {
      const interval = sseIntervalFor(opts, s);
      return [`sse${s}`, `/sse?interval=${interval}&count=${sseCountFor(opts, interval)}&pad=100`];
    }),
  );
  return {
    json: '/mcp',
    ...sse,
    sseWarm: '/sse?interval=5&count=20&pad=100',
    bigWarm: `/big?bytes=${16 * MiB}`,
    big: `/big?bytes=${Math.round(opts.bigMiB * MiB)}`,
    idle: '/idle',
  };
}

/** The longest wait for the cli-proxy's audit queue over the run, for the notes. */
function longestDrain(reps: readonly RepResult[]): { d: AuditDrain; cell: string; rep: number } | undefined {
  let best: { d: AuditDrain; cell: string; rep: number } | undefined;
  for (const r of reps) for (const [cell, d] of Object.entries(r.drains ?? {})) if (!best || d.ms > best.d.ms) best = { d, cell, rep: r.rep };
  return best;
}

async function waitIdleClosed(up: Upstream, port: number, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (((await up.stats())[String(port)]?.idleOpen ?? 0) === 0) return;
    await sleep(100);
  }
}

export async function runBench(opts: BenchOptions, log: (s: string) => void): Promise<BenchResults> {
  const tools = await ensureTools(opts.install, log);
  let peers = [...opts.peers];
  const notes: string[] = [];
  if (!tools.nginx && peers.includes('nginx')) {
    peers = peers.filter((p) => p !== 'nginx');
    notes.push('nginx missing: the nginx peer was skipped.');
    log(notes[notes.length - 1] as string);
  }
  const loadGenerator = tools.wrk ? 'wrk' : 'node';
  if (!tools.wrk) {
    notes.push('wrk missing: the JSON test used the Node load loop (its figures are not comparable with wrk runs).');
    log(notes[notes.length - 1] as string);
  }
  const capped = opts.idleStreams.filter((n) => n > MAX_PROXY_STREAMS);
  if (capped.length) {
    notes.push(
      `RLIMIT_NOFILE here is ${NOFILE} and cannot be raised (no CAP_SYS_RESOURCE); a proxy holds two sockets per stream, nginx ` +
        `starts dropping new connections with fewer than 1/16 of its worker_connections free, and the forwarder and cli-proxy ` +
        `answer 503 past (limit − limit/8) / 2 connections, so ` +
        `${capped.map((n) => n.toLocaleString('en-US')).join(', ')} idle streams were measured as ${MAX_PROXY_STREAMS.toLocaleString('en-US')}.`,
    );
    log(notes[notes.length - 1] as string);
  }
  const machine = machineInfo();
  const endpoints = endpointsFor(opts);
  const started = Date.now();
  const work = newWorkDir();
  const script = writeWrkScript(work);
  const upstream = await startUpstream(peers.length);
  const reps: RepResult[] = [];
  // The floor proxy's memory figures are the least a Node proxy holds: the yardstick for ours.
  const proxyOnly = (ps: Peer[]): Peer[] => ps.filter((p) => p.name !== 'direct' && p.name !== 'forwarder-warn');
  const notWarn = (ps: Peer[]): Peer[] => ps.filter((p) => p.name !== 'forwarder-warn');

  const jsonLoad = (p: Peer, c: number, seconds: number): Promise<WrkResult> =>
    loadGenerator === 'wrk'
      ? runWrk({ url: p.url('json'), script, connections: c, seconds, pids: p.pids(), upstreamPid: upstream.pid })
      : nodeLoad(p.url('json'), c, seconds * 1000, p.pids()).then((r) => ({
          requests: r.requests,
          rps: r.rps,
          p50Ms: r.p50Ms,
          p90Ms: NaN,
          p99Ms: r.p99Ms,
          errors: r.bad,
          cpuUsPerReq: r.cpuUsPerReq,
          upstreamCpuUsPerReq: NaN,
        }));

  try {
    for (let rep = 0; rep < opts.reps; rep++) {
      const result: RepResult = { rep: rep + 1, order: {}, wrk: {}, sse: {}, ttfh: {}, big: {}, idle: {}, errors: [] };
      reps.push(result);
      /** Runs one measurement; a failure is recorded (and retried `retries` times), never fatal. */
      const attempt = async (what: string, f: () => Promise<void>, retries = 0): Promise<void> => {
        for (let i = 0; i <= retries; i++) {
          try {
            await f();
            return;
          } catch (err) {
            const msg = `rep ${rep + 1} ${what}: ${err instanceof Error ? err.message : String(err)}${i < retries ? ' (retried)' : ''}`;
            result.errors.push(msg);
            log(`  ERROR ${msg}`);
          }
        }
      };
      /**
       * After a cell that drove `p`: its audit events are written before anything else is
       * measured (bench/lib/audit-drain.ts), and neither the wait nor its CPU is any cell's.
       */
      const settle = async (p: Peer, cell: string): Promise<void> => {
        await attempt(`audit drain after ${cell} ${p.name}`, async () => {
          const d = await p.auditDrained();
          if (!d) return;
          (result.drains ??= {})[cell] = d;
          if (d.queued > 0) log(`  ${p.name}: ${d.queued} audit events still queued after ${cell}, written in ${(d.ms / 1000).toFixed(1)} s (${(d.cpuUs / 1000).toFixed(0)} ms of CPU, charged to no cell)`);
          if (!d.drained) {
            notes.push(`Repetition ${rep + 1}: the ${p.name}'s audit queue still held ${d.left} events ${AUDIT_DRAIN_BOUND_MS / 1000} s after ${cell}; the run went on, so the next cell measured part of that backlog.`);
            log(`  WARNING ${notes[notes.length - 1] as string}`);
          }
        });
      };
      log(`repetition ${rep + 1}/${opts.reps}: starting ${peers.join(', ')}`);
      const running: Peer[] = [];
      for (const [i, name] of peers.entries()) {
        running.push(await startPeer(name, { cli: opts.cli, baseCli: opts.baseCli, upstreamPort: upstream.ports[i] as number, endpoints, workDir: work }));
      }
      let param = 0;
      const order = (ps: Peer[]): Peer[] => rotate(ps, rep + param++);
      /**
       * A fresh process for a memory test: RSS growth is then the test's own, not the
       * garbage earlier tests left for the collector to find meanwhile.
       */
      const fresh = async (p: Peer): Promise<Peer> => {
        await p.stop();
        const q = await startPeer(p.name, { cli: opts.cli, baseCli: opts.baseCli, upstreamPort: p.upstreamPort, endpoints, workDir: work });
        running[running.indexOf(p)] = q;
        return q;
      };
      try {
        // Warm-up: connections, JIT, buffers; nothing recorded.
        for (const p of running) {
          await attempt(`warm-up ${p.name}`, async () => {
            if (opts.concurrency.length > 0) await jsonLoad(p, 16, Math.min(1, opts.seconds));
            await measureSse(p.url('sseWarm'), 1, 20, 0);
            await slowRead({ url: p.url('bigWarm'), bytes: 16 * MiB, bytesPerSec: 1e12, pids: p.pids(), verify: false });
          });
          await settle(p, 'warm-up');
        }

        for (const c of opts.concurrency) {
          const ps = order(running);
          result.order[`wrk c=${c}`] = ps.map((p) => p.name);
          const row: Partial<Record<PeerName, WrkResult>> = (result.wrk[String(c)] = {});
          for (const p of ps) {
            await attempt(`json c=${c} ${p.name}`, async () => {
              const r = await jsonLoad(p, c, opts.seconds);
              row[p.name] = r;
              log(
                `  json c=${c} ${p.name}: ${r.rps.toFixed(0)} req/s, p50 ${r.p50Ms.toFixed(3)} ms, p99 ${r.p99Ms.toFixed(3)} ms` +
                  `${r.cpuUsPerReq !== undefined ? `, proxy CPU ${r.cpuUsPerReq.toFixed(0)} µs/req` : `, upstream CPU ${r.upstreamCpuUsPerReq.toFixed(0)} µs/req`}` +
                  `${r.errors ? `, ${r.errors} errors` : ''}`,
              );
            });
            await settle(p, `json c=${c}`);
          }
        }

        for (const s of opts.only.has('sse') ? opts.sseStreams : []) {
          const ps = order(notWarn(running));
          result.order[`sse ${s}`] = ps.map((p) => p.name);
          const row: RepResult['sse'][string] = (result.sse[String(s)] = {});
          for (const p of ps) {
            await attempt(`sse ${s} ${p.name}`, async () => {
              const r = await measureSse(p.url(`sse${s}`), s, sseCountFor(opts, sseIntervalFor(opts, s)), SSE_WARM_EVENTS, p.pids());
              row[p.name] = r;
              log(
                `  sse ${s} stream(s) ${p.name}: p50 ${r.p50Us.toFixed(0)} µs, p99 ${r.p99Us.toFixed(0)} µs over ${r.events} events` +
                  `${r.cpuUsPerEvent !== undefined ? `, proxy CPU ${r.cpuUsPerEvent.toFixed(1)} µs/event (runtime ${r.cpuExactUsPerEvent?.toFixed(1)}; steady ${r.cpuSteadyUsPerEvent?.toFixed(1)}, main thread ${r.cpuSteadyMainUsPerEvent?.toFixed(1)})` : ''}${r.disorder ? `, ${r.disorder} out of order/missing` : ''}`,
              );
            });
            await settle(p, `sse ${s}`);
          }
        }

        if (opts.only.has('ttfh')) {
          const ps = order(notWarn(running)).filter((p) => p.name !== 'node-floor');
          result.order.ttfh = ps.map((p) => p.name);
          for (const p of ps) {
            await attempt(`ttfh ${p.name}`, async () => {
              const samples = await timeToHeaders(p.url('idle'), opts.ttfhSamples);
              result.ttfh[p.name] = { samplesMs: samples, medianMs: median(samples) };
              log(`  time to headers (silent upstream) ${p.name}: median ${median(samples).toFixed(2)} ms`);
              await waitIdleClosed(upstream, p.upstreamPort);
            });
            await settle(p, 'ttfh');
          }
        }

        if (opts.only.has('big')) {
          // All proxies at once, each in a fresh process, each to its own paced reader: RSS
          // is per process, and the combined pace is far below what any of them carries.
          const ps = await Promise.all(proxyOnly(running).map(fresh));
          result.order.big = ps.map((p) => p.name);
          for (const p of ps) {
            await attempt(`big warm-up ${p.name}`, async () => {
              await slowRead({ url: p.url('bigWarm'), bytes: 16 * MiB, bytesPerSec: 1e12, pids: p.pids(), verify: false });
            });
          }
          log(`  ${opts.bigMiB} MiB to a ${opts.bigRateMiB} MiB/s reader through ${ps.map((p) => p.name).join(', ')} (concurrently)…`);
          await Promise.all(
            ps.map((p) =>
              attempt(`big ${p.name}`, async () => {
                const r: SlowReadResult = await slowRead({
                  url: p.url('big'),
                  bytes: Math.round(opts.bigMiB * MiB),
                  bytesPerSec: opts.bigRateMiB * MiB,
                  pids: p.pids(),
                  verify: false,
                });
                if (r.bytes !== r.expected) throw new Error(`large body: ${r.bytes} of ${r.expected} bytes`);
                result.big[p.name] = r;
                log(`  big ${p.name}: RSS growth ${(r.growth / 1e6).toFixed(1)} MB in ${r.seconds.toFixed(1)} s`);
              }),
            ),
          );
        }

        for (const requested of opts.only.has('idle') ? opts.idleStreams : []) {
          // Two sockets per stream in the proxy: the fd limit caps what can be held.
          const n = Math.min(requested, MAX_PROXY_STREAMS);
          const ps = order(proxyOnly(running));
          result.order[`idle ${requested}`] = ps.map((p) => p.name);
          const row: Partial<Record<PeerName, IdleStreamsResult>> = (result.idle[String(requested)] = {});
          for (const first of ps) {
            let old = first;
            await attempt(`idle ${n} ${first.name}`, async () => {
              const p = await fresh(old);
              old = p;
              try {
                // Warm-up: a few streams opened and closed, then a moment to settle.
                await timeToHeaders(p.url('idle'), 20);
                await waitIdleClosed(upstream, p.upstreamPort);
                await sleep(500);
                const r = await holdIdleStreams(p.url('idle'), n, p.pids());
                row[p.name] = r;
                await waitIdleClosed(upstream, p.upstreamPort);
                // Leftover connections from undici's reconnect after each aborted stream
                // (nodejs/undici#5845) are closed 0.5 s after they connect; with 10,000
                // streams ending at once the reconnects alone take over a second.
                await sleep(3_000);
                r.upstreamConnectionsLeft = (await upstream.stats())[String(p.upstreamPort)]?.connections;
                log(
                  `  ${n} idle streams ${p.name}: ${(r.bytesPerStream / 1000).toFixed(1)} KB/stream (opened in ${r.openMs} ms); ` +
                    `upstream connections still open 3 s after the clients left: ${r.upstreamConnectionsLeft}`,
                );
              } finally {
                await waitIdleClosed(upstream, p.upstreamPort);
                // Whatever the proxy kept open to the upstream goes with the process, so the
                // shared upstream's fd budget is whole again for the next peer.
                old = await fresh(p);
              }
            }, 1);
          }
        }
      } finally {
        for (const p of running) await p.stop();
      }
    }
  } finally {
    await upstream.stop();
    removeWorkDir(work);
  }

  const longest = longestDrain(reps);
  if (longest) {
    const gauge = 'its `agent_connectors_audit_queued_events` at 0';
    notes.push(
      longest.d.queued === 0
        ? `Between cells the bench checked that the cli-proxy's audit events were all written (${gauge}): no cell left any queued.`
        : `Between cells the bench waited until the cli-proxy's audit events were all written (${gauge}), charged to no cell: ` +
            `the longest wait ${(longest.d.ms / 1000).toFixed(1)} s for ${longest.d.queued.toLocaleString('en-US')} events (after ${longest.cell}, repetition ${longest.rep}).`,
    );
  }
  const results: BenchResults = {
    mode: opts.mode,
    machine,
    loadGenerator,
    notes,
    options: { ...opts, cli: opts.cli },
    peers,
    durationS: (Date.now() - started) / 1000,
    reps,
    summary: summarizeRun(reps, opts, peers),
  };
  const stamp = machine.date.replace(/[:.]/g, '-');
  const out = opts.out ? resolve(opts.out) : resolve(RESULTS_DIR, `${stamp}.json`);
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
  const md = renderMarkdown(results);
  process.stdout.write(`${md}\n`);
  log(`results: ${out}`);
  if (opts.docs) {
    updateDocs(DOCS_FILE, md);
    log(`updated ${DOCS_FILE}`);
  }
  return results;
}
