/**
 * Smoke mode: a few seconds, forwarder only, no nginx or wrk. It proves the harness runs
 * end to end and checks behaviour, never timing: JSON answers byte-identical, SSE events
 * in order and unbuffered (the upstream sends event n+1 only after the client has
 * acknowledged event n, so a buffering proxy stalls the stream), the large body's bytes
 * exact, and a large body to a slow reader keeps the forwarder's RSS flat and the upstream
 * held back by the reader. `contract-tests/bench-smoke.test.ts` runs it in `npm test`.
 */
import { slowRead } from './lib/big.js';
import { holdIdleStreams, timeToHeaders } from './lib/idle.js';
import { nodeLoad } from './lib/load.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { newWorkDir, removeWorkDir, startPeer, type Peer } from './lib/peers.js';
import { sleep } from './lib/proc.js';
import { checkSseOrder, measureSse } from './lib/sse.js';
import { median } from './lib/stats.js';
import { startUpstream, type Upstream } from './lib/upstream-ctl.js';

const MiB = 1024 * 1024;

export interface SmokeCheck {
  name: string;
  ok: boolean;
  detail: string;
}

export interface SmokeOptions {
  cli?: string;
  /** Large body size (default 192 MiB: above the RSS bound, so buffering it would show). */
  bigBytes?: number;
  /** Slow reader pace (default 64 MiB/s: slower than the forwarder can deliver). */
  readerBytesPerSec?: number;
  /** RSS growth bound for the large body (default 96 MB). */
  rssBoundBytes?: number;
  log?: (line: string) => void;
}

export interface SmokeResult {
  ok: boolean;
  checks: SmokeCheck[];
  /** Figures for the curious; never asserted. */
  figures: Record<string, number | undefined>;
}

export async function runSmoke(opts: SmokeOptions = {}): Promise<SmokeResult> {
  const log = opts.log ?? (() => undefined);
  const bigBytes = opts.bigBytes ?? 192 * MiB;
  const rate = opts.readerBytesPerSec ?? 64 * MiB;
  const rssBound = opts.rssBoundBytes ?? 96e6;
  const checks: SmokeCheck[] = [];
  const figures: Record<string, number | undefined> = {};
  const check = (name: string, ok: boolean, detail: string): void => {
    checks.push({ name, ok, detail });
    log(`${ok ? 'ok  ' : 'FAIL'} ${name}: ${detail}`);
  };
  const SSE_ACK_EVENTS = 40;
  const endpoints = {
    json: '/mcp',
    sseAck: `/sse?ack=1&count=${SSE_ACK_EVENTS}&pad=64`,
    sse: '/sse?interval=5&count=60&pad=100',
    bigWarm: `/big?bytes=${16 * MiB}`,
    big: `/big?bytes=${bigBytes}`,
    idle: '/idle',
  };
  const work = newWorkDir();
  let upstream: Upstream | undefined;
  let fwd: Peer | undefined;
  /** Runs one step; a failure (or a step over its time budget) fails that step only. */
  const step = async (name: string, budgetMs: number, f: () => Promise<void>): Promise<void> => {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        f(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`no result within ${budgetMs} ms`)), budgetMs);
        }),
      ]);
    } catch (err) {
      check(name, false, err instanceof Error ? err.message : String(err));
    } finally {
      clearTimeout(timer);
    }
  };
  try {
    upstream = await startUpstream(1);
    const up = upstream;
    const peer = await startPeer('forwarder', { cli: opts.cli ?? DEFAULT_CLI, upstreamPort: up.ports[0] as number, endpoints, workDir: work });
    fwd = peer;
    const pids = peer.pids();
    const port = String(peer.upstreamPort);

    await step('1 KB JSON POST through the forwarder', 20_000, async () => {
      const load = await nodeLoad(peer.url('json'), 4, 1_000, pids);
      figures.jsonRps = load.rps;
      figures.jsonCpuUsPerReq = load.cpuUsPerReq;
      check('1 KB JSON POST through the forwarder', load.requests > 0 && load.bad === 0, `${load.requests} requests, ${load.bad} not 200 with the upstream's exact body`);
    });

    await step('SSE events arrive in order, each before the upstream sends the next', 20_000, async () => {
      const order = await checkSseOrder(peer.url('sseAck'), SSE_ACK_EVENTS, (s, n) => up.ack(s, n));
      check(
        'SSE events arrive in order, each before the upstream sends the next',
        order.events === SSE_ACK_EVENTS && order.inOrder && order.sentAfterPreviousReceived && order.ended,
        `${order.events}/${SSE_ACK_EVENTS} events, in order: ${order.inOrder}, each sent after the previous was received: ${order.sentAfterPreviousReceived}, stream ended: ${order.ended}`,
      );
      check('SSE events byte-identical', order.byteIdentical, `every event's bytes equal what the upstream wrote: ${order.byteIdentical}`);
    });

    await step('SSE latency harness: 4 concurrent streams complete', 20_000, async () => {
      const sse = await measureSse(peer.url('sse'), 4, 60, 10);
      figures.sseP50Us = sse.p50Us;
      check('SSE latency harness: 4 concurrent streams complete', sse.disorder === 0 && sse.events === 4 * 50, `${sse.events} timed events, ${sse.disorder} out of order or missing`);
    });

    await step('headers reach the client while the upstream is silent', 20_000, async () => {
      const ttfh = await timeToHeaders(peer.url('idle'), 3);
      figures.ttfhMs = median(ttfh);
      check('headers reach the client while the upstream is silent', ttfh.length === 3, `3 of 3 idle SSE requests got their headers`);
      let idleOpen = -1;
      for (let i = 0; i < 100; i++) {
        idleOpen = (await up.stats())[port]?.idleOpen ?? -1;
        if (idleOpen === 0) break;
        await sleep(50);
      }
      check('client disconnect closes the upstream request', idleOpen === 0, `upstream idle streams still open after the clients left: ${idleOpen}`);
    });

    await step(`large body: exact bytes (${bigBytes / MiB} MiB)`, 60_000, async () => {
      await slowRead({ url: peer.url('bigWarm'), bytes: 16 * MiB, bytesPerSec: 1e12, pids, verify: false });
      const big = await slowRead({
        url: peer.url('big'),
        bytes: bigBytes,
        bytesPerSec: rate,
        pids,
        verify: true,
        upstreamWritten: async () => (await up.stats())[port]?.bigWritten ?? 0,
      });
      figures.bigGrowthMB = big.growth / 1e6;
      figures.bigMaxLeadMiB = (big.maxLead ?? NaN) / MiB;
      figures.bigSeconds = big.seconds;
      check(
        `large body: exact bytes (${bigBytes / MiB} MiB)`,
        big.bytes === bigBytes && big.contentLength === String(bigBytes) && big.mismatchAt === undefined,
        `${big.bytes} of ${bigBytes} bytes, content-length ${big.contentLength}, first mismatch ${big.mismatchAt ?? 'none'}`,
      );
      check(
        'large body to a slow reader: forwarder RSS flat',
        big.growth < rssBound,
        `RSS growth ${(big.growth / 1e6).toFixed(1)} MB (bound ${(rssBound / 1e6).toFixed(0)} MB; buffering the body would be ~${(bigBytes / 1e6).toFixed(0)} MB)`,
      );
      check(
        'large body to a slow reader: the reader holds the upstream back',
        big.maxLead !== undefined && big.maxLead < 64 * MiB,
        `upstream ran at most ${((big.maxLead ?? NaN) / MiB).toFixed(1)} MiB ahead of the reader (bound 64 MiB)`,
      );
    });

    await step('idle SSE streams harness: 200 streams held', 30_000, async () => {
      const idle = await holdIdleStreams(peer.url('idle'), 200, pids, 300);
      figures.idleKBPerStream = idle.bytesPerStream / 1000;
      check('idle SSE streams harness: 200 streams held', idle.failed === 0 && idle.streams === 200, `${idle.streams - idle.failed} of 200 open`);
    });
  } catch (err) {
    check('harness started', false, err instanceof Error ? (err.stack ?? err.message) : String(err));
  } finally {
    await fwd?.stop();
    await upstream?.stop();
    removeWorkDir(work);
  }
  return { ok: checks.every((c) => c.ok), checks, figures };
}
