import { setTimeout as sleep } from 'node:timers/promises';

/** Polls `pred` every 20 ms until true or the deadline passes; returns whether it became true. */
export async function eventually(pred: () => boolean, timeoutMs = 10_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > deadline) return false;
    await sleep(20);
  }
  return true;
}

/** As `eventually`, but a deadline passed is an error naming what was awaited. */
export async function until(pred: () => boolean, what: string, timeoutMs = 8_000): Promise<void> {
  if (!(await eventually(pred, timeoutMs))) throw new Error(`timed out waiting for: ${what}`);
}
