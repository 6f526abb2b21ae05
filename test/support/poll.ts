/*
 * Waiting, for tests. Prefer waiting for an event (a log line, a request seen, a stream
 * ending); these are for state that announces nothing. A deadline here is a failure,
 * never an assertion of speed.
 */

const EVERY_MS = 20;

/** Polls `pred` until true or the deadline passes; returns whether it became true. */
export async function eventually(pred: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await pred()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, EVERY_MS));
  }
}

/** As `eventually`, but a deadline passed is an error naming what was awaited. */
export async function until(pred: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  if (!(await eventually(pred, timeoutMs))) throw new Error(`timed out waiting for: ${what}`);
}

/** Races `p` against a deadline; the deadline rejects naming `what`. */
export async function within<T>(p: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out waiting for: ${what}`)), timeoutMs);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** A promise resolved from outside, for a test to tell a mock "now" (or learn "it happened"). */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
