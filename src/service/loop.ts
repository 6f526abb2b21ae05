import type { Logger } from '../log/logger.js';

export interface LoopOptions {
  name: string;
  log: Logger;
  signal: AbortSignal;
  /** One round of work; resolves with how long to wait before the next round (ms). */
  step: () => Promise<number>;
  /** Subscribes a callback that cuts the current wait short (a file changed, SIGHUP…). */
  subscribeWake?: (wake: () => void) => () => void;
  /** Wait after a step that threw (the loop never dies of one bad round). */
  errorDelayMs?: number;
}

/**
 * The one interval loop: run a step, wait what it asked for (or until woken or stopped),
 * repeat. Scheduling and backoff decisions belong to the step; this only sequences.
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
      let delay: number;
      try {
        delay = await options.step();
      } catch (err) {
        log.error({ loop: options.name, err: { message: (err as Error).message } }, 'loop step failed');
        delay = options.errorDelayMs ?? 5_000;
      }
      if (signal.aborted || woken) continue;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.max(0, Math.min(delay, 2 ** 31 - 1)));
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
