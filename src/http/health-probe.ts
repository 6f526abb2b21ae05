import { Agent } from 'undici';
import type { PartHealth } from '../data/problem-codes.js';
import { readBodyBounded } from '../net/bounded-body.js';

/**
 * A part's /healthz answer is `{"status":"ok"}` and a few fields; anything longer is not
 * one of ours (a process squatting a stopped part's port), and reading it whole is how a
 * streamed /healthz took the link to 8.3 GB.
 */
export const MAX_HEALTH_BYTES = 4 * 1024;

export interface HealthProbeOptions {
  /** The whole exchange, connect to last byte: undici's own timeouts are per pause, and a trickle never pauses. */
  timeoutMs: number;
  /** A caller's pool (presence keeps one); a one-off pool otherwise. */
  agent?: Agent;
  signal?: AbortSignal;
}

/**
 * The one rule presence, doctor and status read a part's health by: 200 with
 * `status: ok` → ok; any other answer → degraded; no answer, an answer over
 * MAX_HEALTH_BYTES or not complete within `timeoutMs` → down. `said` is the part's own
 * status word (or the HTTP status) of a degraded answer, for doctor's message.
 */
export async function probePartHealth(url: string, options: HealthProbeOptions): Promise<{ health: PartHealth; said?: string }> {
  const deadline = AbortSignal.timeout(options.timeoutMs);
  const signal = options.signal ? AbortSignal.any([options.signal, deadline]) : deadline;
  const agent = options.agent ?? new Agent({ connect: { timeout: options.timeoutMs } });
  try {
    const u = new URL(url);
    const res = await agent.request({
      origin: u.origin,
      path: u.pathname + u.search,
      method: 'GET',
      signal,
      headersTimeout: options.timeoutMs,
      bodyTimeout: options.timeoutMs,
    });
    const text = await readBodyBounded(res.body, MAX_HEALTH_BYTES);
    let status: unknown;
    try {
      status = (JSON.parse(text) as { status?: unknown } | null)?.status;
    } catch {
      status = undefined;
    }
    if (res.statusCode === 200 && status === 'ok') return { health: 'ok' };
    return { health: 'degraded', said: typeof status === 'string' ? status.slice(0, 40) : `status ${res.statusCode}` };
  } catch {
    return { health: 'down' };
  } finally {
    if (!options.agent) await agent.destroy().catch(() => undefined);
  }
}
