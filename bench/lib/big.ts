/**
 * The large body to a slow reader: the client reads at a fixed pace while the proxy's RSS
 * is sampled; growth = peak − RSS just before the request.
 */
import { request } from 'node:http';
import { PatternChecker } from './pattern.js';
import { rssBytes, sleep, sumOver } from './proc.js';

export interface SlowReadResult {
  bytes: number;
  expected: number;
  contentLength: string | undefined;
  /** Offset of the first byte that differed from the pattern (verify mode only). */
  mismatchAt: number | undefined;
  seconds: number;
  baselineRss: number;
  peakRss: number;
  growth: number;
  /** Most the upstream had written beyond what the reader had read (when `upstreamWritten` is given). */
  maxLead: number | undefined;
}

export async function slowRead(opts: {
  url: string;
  bytes: number;
  bytesPerSec: number;
  pids: number[];
  verify: boolean;
  /** Bytes the upstream has written so far, polled alongside RSS. */
  upstreamWritten?: () => Promise<number>;
}): Promise<SlowReadResult> {
  const rss = (): number => (opts.pids.length ? sumOver(opts.pids, rssBytes) : 0);
  const baselineRss = rss();
  let peakRss = baselineRss;
  let got = 0;
  let maxLead: number | undefined;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      try {
        peakRss = Math.max(peakRss, rss());
        if (opts.upstreamWritten) {
          const w = await opts.upstreamWritten();
          maxLead = Math.max(maxLead ?? 0, w - got);
        }
      } catch {
        // the process went away; the byte count will say so
      }
      await sleep(20);
    }
  })();
  const checker = opts.verify ? new PatternChecker() : undefined;
  const started = performance.now();
  let contentLength: string | undefined;
  try {
    await new Promise<void>((resolve, reject) => {
      const req = request(opts.url, { agent: false }, (res) => {
        contentLength = res.headers['content-length'];
        if (res.statusCode !== 200) reject(new Error(`large body: status ${res.statusCode}`));
        res.on('data', (chunk: Buffer) => {
          got += chunk.length;
          checker?.update(chunk);
          const ahead = (got / opts.bytesPerSec) * 1000 - (performance.now() - started);
          if (ahead > 2) {
            res.pause();
            setTimeout(() => res.resume(), ahead);
          }
        });
        res.once('end', () => resolve());
        res.once('error', reject);
        res.once('aborted', () => reject(new Error('large body: connection aborted')));
      });
      req.once('error', reject);
      req.end();
    });
  } finally {
    sampling = false;
    await sampler;
  }
  peakRss = Math.max(peakRss, rss());
  return {
    bytes: got,
    expected: opts.bytes,
    contentLength,
    mismatchAt: checker?.firstMismatch,
    seconds: (performance.now() - started) / 1000,
    baselineRss,
    peakRss,
    growth: peakRss - baselineRss,
    maxLead,
  };
}
