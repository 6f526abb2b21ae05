/** A Node load loop for the smoke mode (no wrk needed): closed-loop POSTs of the 1 KB JSON. */
import { Pool } from 'undici';
import { cpuMicros, sumOver } from './proc.js';
import { percentile } from './stats.js';
import { JSON_REQUEST, JSON_RESPONSE } from './wire.js';

export interface LoadResult {
  requests: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  /** Answers that were not 200 with exactly the upstream's body. */
  bad: number;
  cpuUsPerReq: number | undefined;
}

export async function nodeLoad(url: string, concurrency: number, ms: number, pids: number[]): Promise<LoadResult> {
  const u = new URL(url);
  const pool = new Pool(u.origin, { connections: concurrency, pipelining: 1 });
  const lat: number[] = [];
  let bad = 0;
  const cpu0 = sumOver(pids, cpuMicros);
  const started = Date.now();
  const end = started + ms;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (Date.now() < end) {
        const t0 = process.hrtime.bigint();
        const res = await pool.request({
          path: u.pathname + u.search,
          method: 'POST',
          headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: JSON_REQUEST,
        });
        const body = Buffer.from(await res.body.arrayBuffer());
        lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
        if (res.statusCode !== 200 || !body.equals(JSON_RESPONSE)) bad++;
      }
    }),
  );
  const elapsed = (Date.now() - started) / 1000;
  const cpu = sumOver(pids, cpuMicros) - cpu0;
  await pool.close();
  lat.sort((a, b) => a - b);
  return {
    requests: lat.length,
    rps: lat.length / elapsed,
    p50Ms: percentile(lat, 50),
    p99Ms: percentile(lat, 99),
    bad,
    cpuUsPerReq: pids.length ? cpu / lat.length : undefined,
  };
}
