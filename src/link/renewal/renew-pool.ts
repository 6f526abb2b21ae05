/**
 * How many renewals the link has in flight, and when the next may start: a bound that
 * adapts to the Gateway (additive increase, multiplicative decrease, as TCP does), and one
 * pause for the whole host when the Gateway says `Retry-After`.
 *
 * - Starts at `max` (`--renew-concurrency`): a host with thousands of new bindings wants
 *   them all holding tokens within seconds, and a healthy Gateway answers in milliseconds.
 * - A 429 or 503 (the Gateway shedding load), or an answer slower than `slowMs`, halves the
 *   bound (at most once per `coolMs`: one burst of 64 answers 429 together is one signal);
 *   each answer that is none of these grows it by 1/bound, so a full round of successes
 *   adds one, up to `max`.
 * - `Retry-After` on a 429/503 pauses every slot, not only the one that was answered: the
 *   rate limit is the host's, and the other slots asking meanwhile would only collect
 *   429s and push their own backoff out. No renewal starts before it has passed.
 *
 * A slot's own backoff, requestId and CAS stay the policy's (policy.ts); this only decides
 * when the next slot may start.
 */

export interface RenewPoolOptions {
  max: number;
  /** An answer slower than this counts as the Gateway struggling. */
  slowMs?: number;
  /** Least time between two decreases. */
  coolMs?: number;
  now?: () => number;
}

export interface RenewAnswer {
  /** The Gateway asked the host to slow down (429, 503) or the answer was a network failure. */
  overloaded: boolean;
  retryAfterMs?: number | undefined;
  latencyMs: number;
}

export const DEFAULT_SLOW_MS = 5_000;
const DEFAULT_COOL_MS = 1_000;

export class RenewPool {
  readonly max: number;
  #limit: number;
  #inflight = 0;
  #pausedUntil = 0;
  #lastDecrease = -Infinity;
  #waiters: Array<() => void> = [];
  #timer: NodeJS.Timeout | undefined;
  readonly #slowMs: number;
  readonly #coolMs: number;
  readonly #now: () => number;

  constructor(options: RenewPoolOptions) {
    this.max = Math.max(1, Math.floor(options.max));
    this.#limit = this.max;
    this.#slowMs = options.slowMs ?? DEFAULT_SLOW_MS;
    this.#coolMs = options.coolMs ?? DEFAULT_COOL_MS;
    this.#now = options.now ?? Date.now;
  }

  /** Renewals that may be in flight now. */
  get limit(): number {
    return Math.floor(this.#limit);
  }

  get inflight(): number {
    return this.#inflight;
  }

  /** No renewal starts before this (epoch ms). */
  get pausedUntil(): number {
    return this.#pausedUntil;
  }

  /**
   * Waits for a free place and for any Retry-After to pass, then takes the place. False
   * when `signal` aborted first (nothing taken).
   */
  async acquire(signal?: AbortSignal): Promise<boolean> {
    for (;;) {
      if (signal?.aborted) return false;
      const wait = this.#pausedUntil - this.#now();
      if (wait <= 0 && this.#inflight < this.limit) {
        this.#inflight += 1;
        return true;
      }
      if (wait > 0) this.#wakeAt(wait);
      await new Promise<void>((resolve) => {
        const done = (): void => {
          signal?.removeEventListener('abort', done);
          resolve();
        };
        this.#waiters.push(done);
        signal?.addEventListener('abort', done, { once: true });
      });
    }
  }

  /** Gives the place back with what the Gateway's answer said. */
  release(answer: RenewAnswer): void {
    this.#inflight -= 1;
    const now = this.#now();
    if (answer.retryAfterMs !== undefined && answer.retryAfterMs > 0) this.#pausedUntil = Math.max(this.#pausedUntil, now + answer.retryAfterMs);
    if (answer.overloaded || answer.latencyMs > this.#slowMs) {
      if (now - this.#lastDecrease >= this.#coolMs) {
        this.#limit = Math.max(1, this.#limit / 2);
        this.#lastDecrease = now;
      }
    } else {
      this.#limit = Math.min(this.max, this.#limit + 1 / this.#limit);
    }
    this.#wakeAll();
  }

  #wakeAll(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  #wakeAt(ms: number): void {
    if (this.#timer) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#wakeAll();
    }, ms);
  }

  /** Ends the pause timer (the service stopped). */
  close(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#wakeAll();
  }
}
