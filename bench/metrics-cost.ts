/**
 * `npm run bench -- --metrics`: what `--metrics-listen` costs the forwarder, as process
 * CPU per forwarded request (the 1 KB tools/call JSON exchange, c=16), metrics off vs on.
 * Each repetition starts a fresh pair of forwarders against one upstream and loads them
 * in alternating one-second slices (2 × --seconds each), so drift on a shared machine
 * hits both sides alike; the medians over repetitions are compared.
 * With metrics on, the endpoint is scraped every 15 s, as the README's scrape config
 * does; what one scrape costs is measured on its own.
 */
import type { IncomingMessage } from 'node:http';
import { Registry } from 'prom-client';
import { request } from 'undici';
import type { AccessRecord } from '../src/http/request-pipeline.js';
import { createHttpMetrics } from '../src/metrics/http-metrics.js';
import type { BenchOptions } from './lib/args.js';
import { endpointsFor } from './full.js';
import { nodeLoad } from './lib/load.js';
import { newWorkDir, removeWorkDir, startPeer, type Peer } from './lib/peers.js';
import { cpuMicros, freePort } from './lib/proc.js';
import { median } from './lib/stats.js';
import { ensureTools } from './lib/tools.js';
import { startUpstream } from './lib/upstream-ctl.js';
import { runWrk, writeWrkScript } from './lib/wrk.js';

export interface MetricsCost {
  reps: number;
  connections: number;
  seconds: number;
  load: 'wrk' | 'node';
  offUsPerReq: number[];
  onUsPerReq: number[];
  medianOff: number;
  medianOn: number;
  /** (on − off) / off, percent. */
  diffPct: number;
  /** The hook alone, in this process: CPU per request it adds (µs), and that as a share of the median off figure. */
  hookUsPerReq: number;
  hookPct: number;
  /** CPU of one scrape of the forwarder's /metrics (ms): paid once per scrape interval, not per request. */
  scrapeMs: number;
}

/**
 * What the metrics hook adds to one forwarded request, measured in-process where a
 * shared machine's noise cannot drown it: a tools/call record observed (the HTTP and MCP
 * histograms, the byte counters) over many iterations, CPU time per call.
 */
export function hookCost(iterations = 200_000): number {
  const observer = createHttpMetrics(new Registry(), 'instances.json');
  const req = { url: '/i/bench_json_binding/mcp' } as IncomingMessage;
  const rec = (i: number): AccessRecord => ({
    reqId: 'r',
    method: 'POST',
    status: 200,
    bytesIn: 1024,
    bytesOut: 1024,
    outcome: 'ok',
    mcpMethod: 'tools/call',
    tool: `bench_${i % 20}`,
  });
  for (let i = 0; i < 20_000; i++) observer.closed(req, rec(i), 0.001);
  const records = Array.from({ length: 1000 }, (_v, i) => rec(i));
  const cpu0 = process.cpuUsage();
  for (let i = 0; i < iterations; i++) observer.closed(req, records[i % 1000] as AccessRecord, 0.0005 + (i % 7) * 0.001);
  const cpu = process.cpuUsage(cpu0);
  return (cpu.user + cpu.system) / iterations;
}

export async function runMetricsCost(opts: BenchOptions, log: (s: string) => void): Promise<MetricsCost> {
  const tools = await ensureTools(opts.install, log);
  const work = newWorkDir();
  const upstream = await startUpstream(1);
  const connections = opts.concurrency.length === 1 ? (opts.concurrency[0] as number) : 16;
  const seconds = Math.max(opts.seconds, 4);
  const reps = Math.max(opts.reps, 5);
  const script = writeWrkScript(work);
  const off: number[] = [];
  const on: number[] = [];
  const start = async (metrics: boolean): Promise<{ fwd: Peer; metricsUrl: string; stop: () => Promise<void> }> => {
    const metricsPort = metrics ? await freePort() : 0;
    const fwd = await startPeer('forwarder-warn', {
      cli: opts.cli,
      upstreamPort: upstream.ports[0] as number,
      endpoints: endpointsFor(opts),
      workDir: work,
      extraArgs: metrics ? ['--metrics-listen', `127.0.0.1:${metricsPort}`] : [],
    });
    let scraping = metrics;
    let wake = (): void => undefined;
    const scraper = (async () => {
      while (scraping) {
        await request(`http://127.0.0.1:${metricsPort}/metrics`).then((r) => r.body.dump(), () => undefined);
        await new Promise<void>((r) => {
          const timer = setTimeout(r, 15_000);
          wake = () => {
            clearTimeout(timer);
            r();
          };
        });
      }
    })();
    return {
      fwd,
      metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`,
      stop: async () => {
        scraping = false;
        wake();
        await scraper;
        await fwd.stop();
      },
    };
  };
  /** One slice of load: [CPU µs, requests]. */
  const slice = async (fwd: Peer, s: number): Promise<[number, number]> => {
    const r = tools.wrk
      ? await runWrk({ url: fwd.url('json'), script, connections, seconds: s, pids: fwd.pids(), upstreamPid: upstream.pid })
      : await nodeLoad(fwd.url('json'), connections, s * 1000, fwd.pids());
    if (r.cpuUsPerReq === undefined) throw new Error('no CPU figure for the forwarder');
    return [r.cpuUsPerReq * r.requests, r.requests];
  };
  let scrapeMs = 0;
  try {
    const probe = await start(true);
    try {
      await slice(probe.fwd, 1); // series for every label set the load makes
      const pid = probe.fwd.pids()[0] as number;
      const before = cpuMicros(pid);
      const SCRAPES = 20;
      for (let k = 0; k < SCRAPES; k++) await request(probe.metricsUrl).then((r) => r.body.dump());
      scrapeMs = (cpuMicros(pid) - before) / SCRAPES / 1000;
    } finally {
      await probe.stop();
    }
    for (let i = 0; i < reps; i++) {
      // Both processes live side by side and take the load in alternating one-second
      // slices, so whatever else the machine does in a repetition falls on both alike.
      // Which one starts first alternates too: in an A/A run (both off) the second process
      // started measured up to 12 % more CPU per request than the first.
      const firstOff = i % 2 === 0;
      const a = await start(!firstOff);
      const b = await start(firstOff);
      const pair = firstOff ? ([a, b] as const) : ([b, a] as const);
      try {
        for (const p of pair) await slice(p.fwd, 1); // warm-up: JIT, connection pool
        const cpu = [0, 0];
        const requests = [0, 0];
        for (let k = 0; k < seconds * 2; k++) {
          for (const side of k % 2 === 0 ? [0, 1] : [1, 0]) {
            const [us, n] = await slice((pair[side] as (typeof pair)[number]).fwd, 1);
            cpu[side] = (cpu[side] ?? 0) + us;
            requests[side] = (requests[side] ?? 0) + n;
          }
        }
        off.push((cpu[0] ?? 0) / (requests[0] ?? 1));
        on.push((cpu[1] ?? 0) / (requests[1] ?? 1));
      } finally {
        for (const p of pair) await p.stop();
      }
      log(`metrics cost rep ${i + 1}/${reps}: off ${off.at(-1)?.toFixed(1)} µs/req, on ${on.at(-1)?.toFixed(1)} µs/req`);
    }
  } finally {
    await upstream.stop();
    removeWorkDir(work);
  }
  const medianOff = median(off);
  const medianOn = median(on);
  const hookUsPerReq = hookCost();
  const result: MetricsCost = {
    reps,
    connections,
    seconds,
    load: tools.wrk ? 'wrk' : 'node',
    offUsPerReq: off,
    onUsPerReq: on,
    medianOff,
    medianOn,
    diffPct: ((medianOn - medianOff) / medianOff) * 100,
    hookUsPerReq,
    hookPct: (hookUsPerReq / medianOff) * 100,
    scrapeMs,
  };
  log(
    `forwarder CPU per request, metrics off ${medianOff.toFixed(1)} µs, on ${medianOn.toFixed(1)} µs: ${result.diffPct >= 0 ? '+' : ''}${result.diffPct.toFixed(1)} % (median of ${reps}, c=${connections}, ${seconds} s each, ${result.load})`,
  );
  log(`one scrape of /metrics: ${scrapeMs.toFixed(1)} ms of the forwarder's CPU (every 15 s: ${(scrapeMs / 15).toFixed(2)} ms a second)`);
  log(`the metrics hook alone: ${hookUsPerReq.toFixed(2)} µs of CPU per request = ${result.hookPct.toFixed(2)} % of the forwarder's ${medianOff.toFixed(0)} µs`);
  return result;
}
