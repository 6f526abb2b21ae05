/**
 * SSE clients: per-event latency (receive time minus the send time the upstream embedded,
 * on the shared monotonic clock), and the ordered, unbuffered delivery check (ack mode:
 * the upstream sends event n+1 only after the client acknowledged event n).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { request, type IncomingMessage } from 'node:http';
import { cpuMicros, sumOver } from './proc.js';
import { percentile } from './stats.js';
import { sseEventText, type SseEvent } from './wire.js';

function openStream(url: string, signal?: AbortSignal): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent: false, headers: { accept: 'text/event-stream' }, signal }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new Error(`SSE ${url}: status ${res.statusCode}`));
        return;
      }
      resolve(res);
    });
    req.once('error', reject);
    req.end();
  });
}

interface ParsedEvent {
  raw: string;
  event: SseEvent & { p: string };
  recvNs: bigint;
}

/** Feeds chunks, calls back once per complete event with the time its last byte arrived. */
function eventSplitter(onEvent: (e: ParsedEvent) => void): (chunk: string) => void {
  let buf = '';
  return (chunk) => {
    const recvNs = process.hrtime.bigint();
    buf += chunk;
    let end: number;
    while ((end = buf.indexOf('\n\n')) !== -1) {
      const raw = buf.slice(0, end + 2);
      buf = buf.slice(end + 2);
      const dataLine = raw.split('\n').find((l) => l.startsWith('data: '));
      if (!dataLine) continue;
      onEvent({ raw, event: JSON.parse(dataLine.slice(6)) as SseEvent & { p: string }, recvNs });
    }
  };
}

export interface SseLatency {
  streams: number;
  events: number;
  p50Us: number;
  p99Us: number;
  /** Events out of sequence or missing (should be 0). */
  disorder: number;
  /**
   * The proxy's CPU (all of `pids`) over the whole run, stream set-up included, per event
   * received: steadier than latency on a loaded machine. Absent without pids.
   */
  cpuUsPerEvent?: number;
  /** The same from the scheduler's runtime (exact; see runtimeMicros): the whole run. */
  cpuExactUsPerEvent?: number;
  /**
   * The proxy's runtime per event once every stream is open and warm (each has had its
   * `warm` events) until the first stream's last event: no connection set-up, no
   * first-burst JIT, no teardown, only the events themselves. Absent without pids or
   * without such a window.
   */
  cpuSteadyUsPerEvent?: number;
  /**
   * Of that, the main thread's alone (the first pid's; meaningless for nginx, whose first
   * pid is its idle master): the event loop, where every event's JavaScript runs. The rest
   * is V8's and libuv's helper threads (JIT compiles, parallel scavenges, concurrent marking),
   * which a `--cpu-prof` profile never shows.
   */
  cpuSteadyMainUsPerEvent?: number;
}

/**
 * On-CPU time of every thread of `pids` (or of each one's main thread alone), µs, from
 * /proc/<pid>/task/<tid>/schedstat: the scheduler's own runtime, to the nanosecond.
 * utime + stime are not that here: the kernel samples them at each tick
 * (CONFIG_TICK_CPU_ACCOUNTING, 4 ms at HZ=250), which charges a process woken on a regular
 * beat — one SSE event every 10 ms — by where its runs fall against the tick, not by how
 * long they are. Threads that exited are not counted (a Node proxy's are long-lived).
 */
function runtimeMicros(pids: readonly number[], mainOnly: boolean): number {
  let ns = 0;
  for (const pid of pids) {
    let tids: string[];
    try {
      tids = mainOnly ? [String(pid)] : readdirSync(`/proc/${pid}/task`);
    } catch {
      continue;
    }
    for (const tid of tids) {
      try {
        ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
      } catch {
        // the thread ended meanwhile
      }
    }
  }
  return ns / 1000;
}

/**
 * Opens `streams` SSE streams at once; each yields `count` events. The first `warm`
 * events of each stream are not counted (connection set-up, JIT).
 */
export async function measureSse(url: string, streams: number, count: number, warm: number, pids: readonly number[] = []): Promise<SseLatency> {
  const lat: number[] = [];
  let disorder = 0;
  let received = 0;
  const cpu0 = sumOver(pids, cpuMicros);
  const exact0 = runtimeMicros(pids, false);
  // The steady window: from the moment every stream has had its warm events to the first
  // stream's last event; snapshots taken from inside the event callbacks.
  let warmStreams = 0;
  let steady: { cpu: number; main: number; received: number; at: number } | undefined;
  let steadyEnd: { cpu: number; main: number; received: number; at: number } | undefined;
  const snapshot = (): { cpu: number; main: number; received: number; at: number } => ({
    at: performance.now(),
    cpu: runtimeMicros(pids, false),
    main: runtimeMicros(pids.slice(0, 1), true),
    received,
  });
  const responses = await Promise.all(Array.from({ length: streams }, () => openStream(url)));
  await Promise.all(
    responses.map(
      (res) =>
        new Promise<void>((resolve, reject) => {
          let expect = 0;
          res.setEncoding('latin1');
          res.on(
            'data',
            eventSplitter(({ event, recvNs }) => {
              received++;
              if (event.n !== expect) disorder++;
              expect = event.n + 1;
              if (event.n >= warm) lat.push(Number(recvNs - BigInt(event.t)) / 1000);
              if (pids.length > 0) {
                if (event.n === warm && ++warmStreams === streams) steady = snapshot();
                if (event.n === count - 1 && steady && !steadyEnd) steadyEnd = snapshot();
              }
            }),
          );
          res.once('end', () => {
            if (expect !== count) disorder += count - expect;
            resolve();
          });
          res.once('error', reject);
        }),
    ),
  );
  const cpu = sumOver(pids, cpuMicros) - cpu0;
  const exact = runtimeMicros(pids, false) - exact0;
  lat.sort((a, b) => a - b);
  const out: SseLatency = { streams, events: lat.length, p50Us: percentile(lat, 50), p99Us: percentile(lat, 99), disorder };
  if (pids.length > 0 && received > 0) {
    out.cpuUsPerEvent = cpu / received;
    out.cpuExactUsPerEvent = exact / received;
  }
  // A proxy seconds behind (a saturated machine) delivers the window in one burst: no figure.
  if (steady && steadyEnd && steadyEnd.received > steady.received && steadyEnd.at - steady.at >= 1_000) {
    const n = steadyEnd.received - steady.received;
    out.cpuSteadyUsPerEvent = (steadyEnd.cpu - steady.cpu) / n;
    out.cpuSteadyMainUsPerEvent = (steadyEnd.main - steady.main) / n;
  }
  return out;
}

export interface SseOrderCheck {
  events: number;
  inOrder: boolean;
  /** Every event n>0 was sent after the upstream had seen the client's ack of n-1. */
  sentAfterPreviousReceived: boolean;
  byteIdentical: boolean;
  ended: boolean;
}

/** Ack mode: proves each event reached the client before the upstream sent the next. */
export async function checkSseOrder(url: string, count: number, ack: (stream: string, n: number) => Promise<void>, timeoutMs = 10_000): Promise<SseOrderCheck> {
  const result: SseOrderCheck = { events: 0, inOrder: true, sentAfterPreviousReceived: true, byteIdentical: true, ended: false };
  // One deadline for headers and every event: a buffering proxy withholds both.
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), timeoutMs);
  try {
    const res = await openStream(url, controller.signal);
    res.setEncoding('latin1');
    await new Promise<void>((resolve, reject) => {
      res.on(
        'data',
        eventSplitter(({ raw, event }) => {
          if (event.n !== result.events) result.inOrder = false;
          if (event.n > 0 && event.a !== event.n - 1) result.sentAfterPreviousReceived = false;
          const { p, ...fields } = event;
          if (raw !== sseEventText(fields, p)) result.byteIdentical = false;
          result.events++;
          ack(event.s, event.n).catch(reject);
        }),
      );
      res.once('end', () => {
        result.ended = true;
        resolve();
      });
      res.once('error', reject);
      res.once('close', () => {
        if (!result.ended) reject(new Error('stream closed before its end'));
      });
    });
  } catch (err) {
    if (!controller.signal.aborted) throw err;
    throw new Error(`SSE order check: ${result.events} of ${count} events within ${timeoutMs} ms (a buffering proxy withholds them)`);
  } finally {
    clearTimeout(timer);
  }
  return result;
}
