/** Pure scheduling arithmetic for renewal; all times are epoch milliseconds. */

export interface TokenTimes {
  tokenId: string | null;
  expiresAt: number | null;
  /** When this host received or applied the token; with expiresAt it gives the lifetime. */
  issuedAt: number | null;
}

/**
 * When to renew: at once without a token (or with an unknown lifetime); otherwise when
 * less than a third of the lifetime remains, moved earlier by up to a tenth of the
 * lifetime at random so many hosts and slots do not renew in lockstep.
 */
export function renewDueAt(t: TokenTimes, rand: () => number = Math.random): number {
  if (t.tokenId === null || t.expiresAt === null || t.issuedAt === null) return 0;
  const lifetime = t.expiresAt - t.issuedAt;
  if (lifetime <= 0) return 0;
  return t.issuedAt + (lifetime * 2) / 3 - rand() * (lifetime / 10);
}

// Backoff and Retry-After are shared with the host link (enrol); they live below both.
export { backoffDelay, defaultBackoff, parseRetryAfter, type BackoffOptions } from '../../net/backoff.js';
