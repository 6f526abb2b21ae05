/**
 * `npm run bench -- --audit`: what the native_cli audit costs the cli-proxy per request
 * (a 1 KB JSON POST through `/p/bench/mcp`), `--no-audit` vs audit on, as process CPU and
 * as writes to disk (/proc/<pid>/io). The method of bench/metrics-cost.ts: each repetition
 * starts a fresh pair of cli-proxies against one upstream and loads them in alternating
 * slices, so drift on a shared machine hits both sides alike; medians over repetitions.
 *
 * Two differences. The load is paced (100 calls a second, one keep-alive connection), not wrk
 * flat out: the spool writes one file per event after each answer, in a queue, and
 * takes a few thousand a second on this VM (the first version, fsynced, a few hundred); under wrk's thousands a
 * second the queue runs ever further behind the answers and the slice measures a backlog,
 * not a call. CLI calls come one at a time, far below that rate. And the CPU is every
 * thread's (/proc/<pid>/task/<tid>/schedstat, in ns): whatever runs on libuv's thread pool
 * counts too, and a slice of a few hundred calls is too short for clock ticks.
 * A slice of the audited side closes only once its events are all on disk.
 * The spool's own rate and cost are also measured in this process (AuditSpool on a real
 * directory), where nothing else competes.
 */
import { randomUUID } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import { Pool } from 'undici';
import { AuditSpool } from '../src/cli-proxy/audit-spool.js';
import { listAuditSpool, type AuditEvent } from '../src/data/audit-event.js';
import type { BenchOptions } from './lib/args.js';
import { endpointsFor } from './full.js';
import { newWorkDir, removeWorkDir, startPeer, type Peer } from './lib/peers.js';
import { sleep } from './lib/proc.js';
import { median } from './lib/stats.js';
import { startUpstream } from './lib/upstream-ctl.js';
import { JSON_REQUEST, JSON_RESPONSE } from './lib/wire.js';

interface Side {
  /** CPU µs per request. */
  usPerReq: number[];
  /** write(2)-family calls per request, and bytes the process sent to storage per request. */
  syscwPerReq: number[];
  writeBytesPerReq: number[];
}

export interface AuditCost {
  reps: number;
  /** Requests per second of the paced load, one connection. */
  rate: number;
  /** Seconds per slice; each side gets `slices` of them per repetition. */
  sliceSeconds: number;
  slices: number;
  off: Side;
  on: Side;
  medianOff: number;
  medianOn: number;
  /** (on − off) / off, percent. */
  diffPct: number;
  /** Events found spooled / requests answered by the audited side (1: one event per request). */
  eventsPerRequest: number;
  /** The spool alone, in this process: CPU per event (µs) and the events per second one queue sustains. */
  spoolUsPerEvent: number;
  spoolEventsPerS: number;
}

/** The counters of /proc/<pid>/io that say what a process asked of the disk. */
function io(pid: number): { syscw: number; writeBytes: number } {
  const text = readFileSync(`/proc/${pid}/io`, 'utf8');
  const field = (name: string): number => Number(new RegExp(`^${name}: (\\d+)$`, 'm').exec(text)?.[1] ?? NaN);
  return { syscw: field('syscw'), writeBytes: field('write_bytes') };
}

/** CPU time of every thread of `pid`, µs (schedstat: ns on CPU, per thread). */
function cpuAllThreads(pid: number): number {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // a thread that ended between the listing and the read
    }
  }
  return ns / 1000;
}

/** `n` POSTs at `rate` a second on one keep-alive connection; throws on a wrong answer. */
async function paced(url: string, rate: number, n: number): Promise<void> {
  const u = new URL(url);
  const pool = new Pool(u.origin, { connections: 1, pipelining: 1 });
  const t0 = performance.now();
  try {
    for (let i = 0; i < n; i++) {
      const wait = t0 + (i * 1000) / rate - performance.now();
      if (wait > 0) await sleep(wait);
      const res = await pool.request({ path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON_REQUEST });
      const body = Buffer.from(await res.body.arrayBuffer());
      if (res.statusCode !== 200 || !body.equals(JSON_RESPONSE)) throw new Error(`request ${i}: status ${res.statusCode}`);
    }
  } finally {
    await pool.close();
  }
}

/** Until `dir` holds `n` events (each answered call's), at most `capMs`. */
async function spooled(dir: string, n: number, capMs = 120_000): Promise<number> {
  const deadline = Date.now() + capMs;
  for (;;) {
    const have = (await listAuditSpool(dir)).length;
    if (have >= n) return have;
    if (Date.now() > deadline) throw new Error(`${dir}: ${have} of ${n} events after ${capMs} ms`);
    await sleep(100);
  }
}

/**
 * Calls a second: far below what the spool sustains on this VM even while others load it
 * (the in-process figure), and above what CLIs run by agents make.
 */
const RATE = 100;

const EVENT: Omit<AuditEvent, 'id' | 'time'> = { provider: 'bench', method: 'POST', path: '/mcp', status: 200, bytesIn: 1024, bytesOut: 1024, durationMs: 1.2, peerUid: 0 };

/** The spool written from this process: CPU per event and events per second, on `dir`'s disk. */
export async function spoolCost(dir: string, events = 2_000): Promise<{ usPerEvent: number; eventsPerS: number }> {
  const spool = new AuditSpool({ dir, maxEvents: 1e9 }, pino({ level: 'silent' }));
  await spool.open();
  for (let i = 0; i < 200; i++) spool.record({ ...EVENT, id: randomUUID(), time: new Date().toISOString() });
  await spool.flush(); // warm-up: JIT, directory
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < events; i++) spool.record({ ...EVENT, id: randomUUID(), time: new Date().toISOString() });
  await spool.flush();
  const wallS = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  return { usPerEvent: (cpu.user + cpu.system) / events, eventsPerS: events / wallS };
}

export async function runAuditCost(opts: BenchOptions, log: (s: string) => void): Promise<AuditCost> {
  const work = newWorkDir();
  const upstream = await startUpstream(1);
  const rate = RATE;
  const sliceSeconds = 2;
  const slices = 4;
  const reps = Math.max(opts.reps, 5);
  const perSlice = rate * sliceSeconds;
  const off: Side = { usPerReq: [], syscwPerReq: [], writeBytesPerReq: [] };
  const on: Side = { usPerReq: [], syscwPerReq: [], writeBytesPerReq: [] };
  let events = 0;
  let audited = 0;
  let spool = { usPerEvent: 0, eventsPerS: 0 };
  const start = (auditDir: string | undefined): Promise<Peer> =>
    startPeer('cli-proxy', {
      cli: opts.cli,
      upstreamPort: upstream.ports[0] as number,
      endpoints: endpointsFor(opts),
      workDir: work,
      // A bound no run reaches: the figure is the steady cost of writing, not of dropping.
      extraArgs: auditDir ? ['--audit-dir', auditDir, '--audit-max-events', '100000000'] : ['--no-audit'],
    });
  try {
    spool = await spoolCost(join(work, 'spool-probe'));
    for (let i = 0; i < reps; i++) {
      // Which one starts first alternates (see bench/metrics-cost.ts: the second started measured more).
      const firstOff = i % 2 === 0;
      const auditDir = join(work, `audit-${i}`);
      mkdirSync(auditDir, { mode: 0o770 });
      const a = await start(firstOff ? undefined : auditDir);
      const b = await start(firstOff ? auditDir : undefined);
      const pair = firstOff ? ([a, b] as const) : ([b, a] as const);
      let sent = 0;
      /** One slice: [CPU µs, syscw, write bytes, requests], the audited side's events on disk. */
      const slice = async (side: number, n: number): Promise<number[]> => {
        const peer = pair[side] as Peer;
        const pid = peer.pids()[0] as number;
        const cpu0 = cpuAllThreads(pid);
        const io0 = io(pid);
        await paced(peer.url('json'), rate, n);
        if (side === 1) await spooled(auditDir, (sent += n));
        const io1 = io(pid);
        return [cpuAllThreads(pid) - cpu0, io1.syscw - io0.syscw, io1.writeBytes - io0.writeBytes, n];
      };
      try {
        for (const side of [0, 1]) await slice(side, Math.min(perSlice, 200)); // JIT, connection, spool directory
        const sums = [
          [0, 0, 0, 0],
          [0, 0, 0, 0],
        ];
        for (let k = 0; k < slices; k++) {
          for (const side of k % 2 === 0 ? [0, 1] : [1, 0]) {
            const got = await slice(side, perSlice);
            const sum = sums[side] as number[];
            got.forEach((v, j) => (sum[j] = (sum[j] ?? 0) + v));
          }
        }
        for (const [side, into] of [off, on].entries()) {
          const [cpu, syscw, bytes, n] = sums[side] as [number, number, number, number];
          into.usPerReq.push(cpu / n);
          into.syscwPerReq.push(syscw / n);
          into.writeBytesPerReq.push(bytes / n);
        }
        audited += sent;
        events += (await listAuditSpool(auditDir)).length;
      } finally {
        for (const p of pair) await p.stop();
      }
      log(`audit cost rep ${i + 1}/${reps}: off ${off.usPerReq.at(-1)?.toFixed(1)} µs/req, on ${on.usPerReq.at(-1)?.toFixed(1)} µs/req`);
    }
  } finally {
    await upstream.stop();
    removeWorkDir(work);
  }
  const medianOff = median(off.usPerReq);
  const medianOn = median(on.usPerReq);
  const result: AuditCost = {
    reps,
    rate,
    sliceSeconds,
    slices,
    off,
    on,
    medianOff,
    medianOn,
    diffPct: ((medianOn - medianOff) / medianOff) * 100,
    eventsPerRequest: events / audited,
    spoolUsPerEvent: spool.usPerEvent,
    spoolEventsPerS: spool.eventsPerS,
  };
  log(
    `cli-proxy CPU per request, audit off ${medianOff.toFixed(1)} µs, on ${medianOn.toFixed(1)} µs: ${result.diffPct >= 0 ? '+' : ''}${result.diffPct.toFixed(1)} % (median of ${reps}; ${rate} req/s on one connection, ${slices} × ${sliceSeconds} s a side)`,
  );
  log(
    `disk per request: off ${median(off.syscwPerReq).toFixed(2)} writes, ${median(off.writeBytesPerReq).toFixed(0)} B; on ${median(on.syscwPerReq).toFixed(2)} writes, ${median(on.writeBytesPerReq).toFixed(0)} B; ${result.eventsPerRequest.toFixed(3)} events spooled per request`,
  );
  log(`the spool alone: ${spool.usPerEvent.toFixed(0)} µs of CPU per event, ${spool.eventsPerS.toFixed(0)} events/s from one queue`);
  return result;
}
