/** Retry timing shared by every client of the Gateway (renewal, enrolment, the link). */

export interface BackoffOptions {
  baseMs: number;
  capMs: number;
}

export const defaultBackoff: BackoffOptions = { baseMs: 1_000, capMs: 5 * 60_000 };

/**
 * Exponential backoff with full jitter (uniform in [0, min(cap, base·2^attempt))), never
 * sooner than the server's Retry-After.
 */
export function backoffDelay(attempt: number, retryAfterMs: number | undefined, options: BackoffOptions = defaultBackoff, rand: () => number = Math.random): number {
  const ceiling = Math.min(options.capMs, options.baseMs * 2 ** Math.min(attempt, 30));
  return Math.max(retryAfterMs ?? 0, Math.floor(rand() * ceiling));
}

/** Retry-After as delta-seconds or an HTTP date; undefined when absent or unparseable. */
export function parseRetryAfter(value: string | string[] | undefined, now: number): number | undefined {
  const v = Array.isArray(value) ? value[0] : value;
  if (!v) return undefined;
  if (/^\d+$/.test(v.trim())) return Number(v.trim()) * 1000;
  // Only the HTTP-date forms of RFC 9110 (IMF-fixdate, RFC 850, asctime): V8's lenient
  // Date.parse would read "retry 2099" as a date decades away.
  const httpDate =
    /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} GMT$/.test(v.trim()) ||
    /^(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), \d{2}-(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)-\d{2} \d{2}:\d{2}:\d{2} GMT$/.test(v.trim()) ||
    /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/.test(v.trim());
  if (!httpDate) return undefined;
  const date = Date.parse(v);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}
