/** Idle SSE streams: time to headers while the upstream is silent, and RSS per idle stream. */
import { request } from 'node:http';
import { createInterface } from 'node:readline';
import { IDLE_CLIENTS_JS } from './paths.js';
import { NOFILE, rssBytes, sleep, spawnTracked, stopChild, sumOver } from './proc.js';

/** Request start → response headers, fresh connection each time; ms, in sample order. */
export async function timeToHeaders(url: string, samples: number, timeoutMs = 10_000): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < samples; i++) {
    out.push(
      await new Promise<number>((resolve, reject) => {
        const t0 = process.hrtime.bigint();
        const req = request(url, { agent: false, headers: { accept: 'text/event-stream' } }, (res) => {
          const ms = Number(process.hrtime.bigint() - t0) / 1e6;
          clearTimeout(timer);
          req.destroy();
          if (res.statusCode !== 200) reject(new Error(`idle SSE ${url}: status ${res.statusCode}`));
          else resolve(ms);
        });
        const timer = setTimeout(() => {
          req.destroy();
          reject(new Error(`idle SSE ${url}: no headers within ${timeoutMs} ms`));
        }, timeoutMs);
        req.once('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
        req.end();
      }),
    );
    await sleep(5);
  }
  return out;
}

export interface IdleStreamsResult {
  streams: number;
  failed: number;
  openMs: number;
  baselineRss: number;
  heldRss: number;
  bytesPerStream: number;
  /** Upstream connections the proxy still held 3 s after every client had gone (set by the caller). */
  upstreamConnectionsLeft?: number;
}

const PER_CLIENT = 5_000;

/**
 * Opens `n` idle SSE streams through a peer (client processes of ≤5000 sockets each),
 * holds them `holdMs` while sampling the proxy's RSS, then resets them. RSS per stream =
 * (max held RSS − RSS before) / n.
 */
export async function holdIdleStreams(url: string, n: number, pids: number[], holdMs = 1_000): Promise<IdleStreamsResult> {
  const u = new URL(url);
  const rss = (): number => sumOver(pids, rssBytes);
  const baselineRss = rss();
  const clients = Math.ceil(n / PER_CLIENT);
  const started = Date.now();
  const procs = Array.from({ length: clients }, (_, i) => {
    const count = Math.min(PER_CLIENT, n - i * PER_CLIENT);
    const cfg = { host: u.hostname, port: Number(u.port), path: u.pathname + u.search, count, parallel: 256 };
    return spawnTracked(process.execPath, [IDLE_CLIENTS_JS, JSON.stringify(cfg)], { stdio: ['pipe', 'pipe', 'inherit'], nofile: NOFILE });
  });
  try {
    const reports = await Promise.all(
      procs.map(
        (p) =>
          new Promise<{ ready: number; failed: number; firstError?: string }>((resolve, reject) => {
            createInterface({ input: p.stdout! }).once('line', (line) => resolve(JSON.parse(line) as { ready: number; failed: number }));
            p.once('exit', (code) => reject(new Error(`idle client exited (${code}) before reporting`)));
          }),
      ),
    );
    const openMs = Date.now() - started;
    const failed = reports.reduce((a, r) => a + r.failed, 0);
    if (failed > 0) throw new Error(`${failed} of ${n} idle streams failed to open: ${reports.find((r) => r.firstError)?.firstError}`);
    let heldRss = rss();
    const until = Date.now() + holdMs;
    while (Date.now() < until) {
      await sleep(100);
      heldRss = Math.max(heldRss, rss());
    }
    return { streams: n, failed, openMs, baselineRss, heldRss, bytesPerStream: (heldRss - baselineRss) / n };
  } finally {
    for (const p of procs) p.stdin?.end();
    await Promise.all(procs.map((p) => stopChild(p, 'SIGTERM', 10_000).catch(() => undefined)));
  }
}
