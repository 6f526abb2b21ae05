/**
 * How a helper that receives data (log lines, body bytes, requests) lets tests wait for
 * it without polling: the receiver calls `wake()` on every arrival, and each waiter
 * re-checks its own condition then. A deadline here is a failure, never a speed check.
 */
export class Wakeups {
  private waiters: Array<() => void> = [];

  /** Every waiter re-checks; call it whenever new data arrives or the source ends. */
  wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Resolves at the next `wake()`, or once `deadline` (a `Date.now()` time) passes. */
  next(deadline = Infinity): Promise<void> {
    return new Promise<void>((resolve) => {
      // setTimeout takes Infinity for 1 ms, hence no timer without a deadline.
      const timer = Number.isFinite(deadline) ? setTimeout(resolve, Math.max(0, deadline - Date.now())) : undefined;
      this.waiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /**
   * Calls `check` now and after every wake until it returns a value. Past `timeoutMs` it
   * throws an Error saying `describe()`; `check` throws to give up early (the source ended).
   */
  async until<T>(check: () => T | undefined, timeoutMs: number, describe: () => string): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = check();
      if (found !== undefined) return found;
      if (Date.now() >= deadline) throw new Error(describe());
      await this.next(deadline);
    }
  }
}
