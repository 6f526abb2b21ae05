/**
 * `npm run bench -- --metrics`: what `--metrics-listen` costs the forwarder, as process
 * CPU per forwarded request (the 1 KB tools/call JSON exchange, c=16), metrics off vs on.
 * The two run in alternation, each repetition on a fresh pair of processes against one
 * upstream, so drift on a shared machine hits both sides alike; the medians are compared.
 * With metrics on, the endpoint is scraped once a second, as a Prometheus would (a
 * 15 s interval costs less).
 */
import type { IncomingMessage } from 'node:http';
import { Registry } from 'prom-client';
import { request } from 'undici';
import type { AccessRecord } from '../src/http/request-pipeline.js';
import { createHttpMetrics } from '../src/metrics/http-metrics.js';
import type { BenchOptions } from './lib/args.js';
import { endpointsFor } from './full.js';
import { nodeLoad } from './lib/load.js';
import { newWorkDir, removeWorkDir, startPeer } from './lib/peers.js';
import { freePort } from './lib/proc.js';
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
  const measure = async (metrics: boolean): Promise<number> => {
    const metricsPort = metrics ? await freePort() : 0;
    const fwd = await startPeer('forwarder-warn', {
      cli: opts.cli,
      upstreamPort: upstream.ports[0] as number,
      endpoints: endpointsFor(opts),
      workDir: work,
      extraArgs: metrics ? ['--metrics-listen', `127.0.0.1:${metricsPort}`] : [],
    });
    let scraping = true;
    const scraper = (async () => {
      while (metrics && scraping) {
        await request(`http://127.0.0.1:${metricsPort}/metrics`).then((r) => r.body.dump(), () => undefined);
        await new Promise((r) => setTimeout(r, 1000));
      }
    })();
    try {
      const run = async (s: number): Promise<number | undefined> =>
        tools.wrk
          ? (await runWrk({ url: fwd.url('json'), script, connections, seconds: s, pids: fwd.pids(), upstreamPid: upstream.pid })).cpuUsPerReq
          : (await nodeLoad(fwd.url('json'), connections, s * 1000, fwd.pids())).cpuUsPerReq;
      await run(1); // warm-up: JIT, connection pool
      const us = await run(seconds);
      if (us === undefined) throw new Error('no CPU figure for the forwarder');
      return us;
    } finally {
      scraping = false;
      await scraper;
      await fwd.stop();
    }
  };
  try {
    for (let i = 0; i < reps; i++) {
      // Alternate which goes first: a trend over the run then cancels out.
      const first = i % 2 === 0;
      const a = await measure(!first);
      const b = await measure(first);
      (first ? off : on).push(a);
      (first ? on : off).push(b);
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
  };
  log(
    `forwarder CPU per request, metrics off ${medianOff.toFixed(1)} µs, on ${medianOn.toFixed(1)} µs: ${result.diffPct >= 0 ? '+' : ''}${result.diffPct.toFixed(1)} % (median of ${reps}, c=${connections}, ${seconds} s each, ${result.load})`,
  );
  log(`the metrics hook alone: ${hookUsPerReq.toFixed(2)} µs of CPU per request = ${result.hookPct.toFixed(2)} % of the forwarder's ${medianOff.toFixed(0)} µs`);
  return result;
}
