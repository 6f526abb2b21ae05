/**
 * `npm run bench -- --metrics`: what `--metrics-listen` costs the forwarder, as process
 * CPU per forwarded request (the 1 KB tools/call JSON exchange, c=16), metrics off vs on.
 * Each repetition starts three fresh forwarders against one upstream (off, off again as an
 * A/A control, on) and loads them in rotating one-second slices (3 × --seconds each), so
 * drift on a shared machine hits all alike; each repetition's own on/off difference and
 * the control's are reported, with their medians over repetitions.
 * BENCH_ON_CLI=PATH runs the "on" side from another build (an experiment: metrics with a
 * part of them cut out) against this one's "off" sides.
 * With metrics on, the endpoint is scraped every 15 s, as the scrape config in docs/metrics.md
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
  offAgainUsPerReq: number[];
  onUsPerReq: number[];
  medianOff: number;
  medianOn: number;
  /** (median on − median off) / median off, percent. */
  diffPct: number;
  /** The median over repetitions of each repetition's own (on − off) / off, percent. */
  pairedDiffPct: number;
  /** The same for two processes with metrics off (A/A): the noise floor of the figure above. */
  controlDiffPct: number;
  /** One process, the observer switched off and on between slices: median over repetitions of (on − off) / off, percent. */
  inProcessDiffPct: number;
  /** The same process, on vs on again (A/A): the noise floor of the figure above. */
  inProcessControlPct: number;
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

function signed(pct: number | undefined): string {
  if (pct === undefined) return '?';
  return `${pct >= 0 ? '+' : ''}${pct.toFixed(1)}`;
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
  const offAgain: number[] = [];
  const on: number[] = [];
  const pairedPct: number[] = [];
  const controlPct: number[] = [];
  const inProcessPct: number[] = [];
  const inProcessControlPct: number[] = [];
  const start = async (metrics: boolean): Promise<{ fwd: Peer; metricsUrl: string; stop: () => Promise<void> }> => {
    const metricsPort = metrics ? await freePort() : 0;
    const fwd = await startPeer('forwarder-warn', {
      cli: metrics && process.env.BENCH_ON_CLI ? process.env.BENCH_ON_CLI : opts.cli,
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
    // One process, the observer switched off and on between slices (test hook
    // metrics-toggle, SIGUSR2): what metrics add per request, without what two processes
    // differ by. Slices rotate through on, off and on again (the A/A control).
    process.env.AGENT_CONNECTORS_TEST_HOOKS = 'metrics-toggle';
    const toggled = await start(true).finally(() => delete process.env.AGENT_CONNECTORS_TEST_HOOKS);
    try {
      const pid = toggled.fwd.pids()[0] as number;
      let observing = true;
      const setObserving = async (want: boolean): Promise<void> => {
        if (observing === want) return;
        process.kill(pid, 'SIGUSR2');
        observing = want;
        await new Promise((r) => setTimeout(r, 100)); // the signal is handled between requests
      };
      await slice(toggled.fwd, 1);
      const kinds = [true, false, true] as const; // on, off, on again
      for (let i = 0; i < reps; i++) {
        const cpu = [0, 0, 0];
        const requests = [0, 0, 0];
        for (let k = 0; k < seconds * 3; k++) {
          const side = (k + i) % 3;
          await setObserving(kinds[side] as boolean);
          const [us, n] = await slice(toggled.fwd, 1);
          cpu[side] = (cpu[side] as number) + us;
          requests[side] = (requests[side] as number) + n;
        }
        const perReq = cpu.map((c, side) => c / (requests[side] as number));
        const [onUs, offUs, onAgainUs] = perReq as [number, number, number];
        inProcessPct.push(((onUs - offUs) / offUs) * 100);
        inProcessControlPct.push(((onAgainUs - onUs) / onUs) * 100);
        log(`metrics cost, one process, rep ${i + 1}/${reps}: off ${offUs.toFixed(1)}, on ${onUs.toFixed(1)}, on again ${onAgainUs.toFixed(1)} µs/req (on ${signed(inProcessPct.at(-1))} %, control ${signed(inProcessControlPct.at(-1))} %)`);
      }
    } finally {
      await toggled.stop();
    }
    for (let i = 0; i < reps; i++) {
      // Three processes live side by side and take the load in rotating one-second
      // slices, so whatever else the machine does in a repetition falls on all alike:
      // metrics off, off again (the A/A control: what two identical processes differ by
      // here), and on. Which starts first rotates too: in an A/A run the process started
      // second once measured 12 % more CPU per request than the first.
      const kinds = [false, false, true] as const;
      const order = [0, 1, 2].map((k) => (k + i) % 3);
      const started = new Map<number, Awaited<ReturnType<typeof start>>>();
      try {
        for (const side of order) started.set(side, await start(kinds[side] as boolean));
        const fwd = (side: number): Peer => (started.get(side) as Awaited<ReturnType<typeof start>>).fwd;
        for (const side of order) await slice(fwd(side), 1); // warm-up: JIT, connection pool
        const cpu = [0, 0, 0];
        const requests = [0, 0, 0];
        for (let k = 0; k < seconds * 3; k++) {
          for (let j = 0; j < 3; j++) {
            const side = order[(j + k) % 3] as number;
            const [us, n] = await slice(fwd(side), 1);
            cpu[side] = (cpu[side] as number) + us;
            requests[side] = (requests[side] as number) + n;
          }
        }
        const perReq = cpu.map((c, side) => c / (requests[side] as number));
        off.push(perReq[0] as number);
        offAgain.push(perReq[1] as number);
        on.push(perReq[2] as number);
        pairedPct.push((((perReq[2] as number) - (perReq[0] as number)) / (perReq[0] as number)) * 100);
        controlPct.push((((perReq[1] as number) - (perReq[0] as number)) / (perReq[0] as number)) * 100);
      } finally {
        for (const p of started.values()) await p.stop();
      }
      log(
        `metrics cost rep ${i + 1}/${reps}: off ${off.at(-1)?.toFixed(1)}, off again ${offAgain.at(-1)?.toFixed(1)}, on ${on.at(-1)?.toFixed(1)} µs/req (on ${signed(pairedPct.at(-1))} %, control ${signed(controlPct.at(-1))} %)`,
      );
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
    offAgainUsPerReq: offAgain,
    onUsPerReq: on,
    medianOff,
    medianOn,
    diffPct: ((medianOn - medianOff) / medianOff) * 100,
    pairedDiffPct: median(pairedPct),
    controlDiffPct: median(controlPct),
    inProcessDiffPct: median(inProcessPct),
    inProcessControlPct: median(inProcessControlPct),
    hookUsPerReq,
    hookPct: (hookUsPerReq / medianOff) * 100,
    scrapeMs,
  };
  log(
    `forwarder CPU per request, metrics off ${medianOff.toFixed(1)} µs, on ${medianOn.toFixed(1)} µs: ${signed(result.diffPct)} % (median of ${reps}, c=${connections}, ${seconds} s each, ${result.load}); paired per repetition ${signed(result.pairedDiffPct)} %, A/A control ${signed(result.controlDiffPct)} %`,
  );
  log(`one process, observer off and on: ${signed(result.inProcessDiffPct)} % per request (median of ${reps}); A/A control ${signed(result.inProcessControlPct)} %`);
  log(`one scrape of /metrics: ${scrapeMs.toFixed(1)} ms of the forwarder's CPU (every 15 s: ${(scrapeMs / 15).toFixed(2)} ms a second)`);
  log(`the metrics hook alone: ${hookUsPerReq.toFixed(2)} µs of CPU per request = ${result.hookPct.toFixed(2)} % of the forwarder's ${medianOff.toFixed(0)} µs`);
  return result;
}
