/**
 * Between cells: the cli-proxy answers a call first and writes its audit event after, from a
 * queue (docs/audit.md). A wrk cell can answer calls faster than the spool writes them,
 * and what is still queued when the cell ends is written while the next cell runs: its
 * CPU lands on that cell (one SSE event measured at 3 333 µs of CPU, 3 December) and the
 * machine is busier for every peer measured meanwhile. So after a cell that drove the
 * cli-proxy the bench polls its `agent_connectors_audit_queued_events` until 0, bounded;
 * the wait and the CPU spent in it are recorded apart and charged to no cell.
 */
import { request } from 'node:http';
import { cpuMicros, sleep, sumOver } from './proc.js';

/** Past this the bench says so and goes on: a stalled disk must not stall the run for good. */
export const AUDIT_DRAIN_BOUND_MS = 60_000;
/** The first poll soon (most drains take no time), then every 250 ms at most: each scrape costs the part ~1 ms of CPU. */
const POLL_FIRST_MS = 20;
const POLL_MAX_MS = 250;
const QUEUED = /^agent_connectors_audit_queued_events(?:\{[^}]*\})? (\S+)$/m;

/** What one wait found: the queue when the cell ended, how long it took to empty, and what that cost the cli-proxy. */
export interface AuditDrain {
  /** Events queued when the wait began. */
  queued: number;
  ms: number;
  /** CPU of the cli-proxy's process during the wait, µs (the backlog's writes). */
  cpuUs: number;
  /** false: the bound passed with events still queued (`left`). */
  drained: boolean;
  left: number;
}

/** The gauge from a scrape; undefined when the part serves none (audit off, or a build from before the gauge). */
export function queuedAuditEvents(metricsPort: number): Promise<number | undefined> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: metricsPort, path: '/metrics', agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.once('end', () => {
        if (res.statusCode !== 200) return reject(new Error(`metrics on port ${metricsPort} answered ${res.statusCode}`));
        const m = QUEUED.exec(text);
        resolve(m ? Number(m[1]) : undefined);
      });
    });
    req.once('error', reject);
    req.end();
  });
}

/**
 * Waits until the part on `metricsPort` has no audit event queued, at most `boundMs`.
 * Undefined when it reports no queue (nothing to wait for).
 */
export async function waitAuditDrained(metricsPort: number, pids: readonly number[], boundMs = AUDIT_DRAIN_BOUND_MS): Promise<AuditDrain | undefined> {
  const cpu0 = sumOver(pids, cpuMicros);
  const t0 = performance.now();
  const first = await queuedAuditEvents(metricsPort);
  if (first === undefined) return undefined;
  let left = first;
  for (let wait = POLL_FIRST_MS; left > 0 && performance.now() - t0 < boundMs; wait = Math.min(POLL_MAX_MS, wait * 2)) {
    await sleep(wait);
    left = (await queuedAuditEvents(metricsPort)) ?? 0;
  }
  return { queued: first, ms: performance.now() - t0, cpuUs: sumOver(pids, cpuMicros) - cpu0, drained: left === 0, left };
}
