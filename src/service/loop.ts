import type { Logger } from '../log/logger.js';

export interface LoopOptions {
  name: string;
  log: Logger;
  signal: AbortSignal;
  /**
   * One round of work; resolves with how long to wait before the next round (ms), or
   * `'done'` when there is nothing more to do (one-shot runs).
   */
  step: () => Promise<number | 'done'>;
  /** Subscribes a callback that cuts the current wait short (a file changed, SIGHUP…). */
  subscribeWake?: (wake: () => void) => () => void;
  /** Wait after a step that threw (a long-running loop never dies of one bad round). */
  errorDelayMs?: number;
  /** A step that throws ends the loop with its error instead (one-shot runs exit 1). */
  failFast?: boolean;
}

/**
 * The one interval loop: run a step, wait what it asked for (or until woken or stopped),
 * repeat until the step is done or the signal aborts. Scheduling and backoff decisions
 * belong to the step; this only sequences, so every wait of a long-running part or a
 * one-shot one ends on SIGTERM.
 */
export async function runLoop(options: LoopOptions): Promise<void> {
  const { signal, log } = options;
  let wakeNow: (() => void) | undefined;
  let woken = false;
  const unsubscribe = options.subscribeWake?.(() => {
    woken = true;
    wakeNow?.();
  });
  try {
    while (!signal.aborted) {
      woken = false;
      let delay: number | 'done';
      try {
        delay = await options.step();
      } catch (err) {
        if (options.failFast) throw err;
        log.error({ loop: options.name, err: { message: (err as Error).message } }, 'loop step failed');
        delay = options.errorDelayMs ?? 5_000;
      }
      if (delay === 'done') break;
      if (signal.aborted || woken) continue;
      const ms = Math.max(0, Math.min(delay, 2 ** 31 - 1));
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, ms);
        function done(): void {
          clearTimeout(timer);
          signal.removeEventListener('abort', done);
          wakeNow = undefined;
          resolve();
        }
        wakeNow = done;
        signal.addEventListener('abort', done, { once: true });
      });
    }
  } finally {
    unsubscribe?.();
  }
}
