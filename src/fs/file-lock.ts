import { lstat, open, unlink } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { readBoundedRegularFile } from './bounded-read.js';
import { processAlive } from './process-alive.js';

export interface LockOptions {
  timeoutMs?: number;
  retryMs?: number;
  /** Stops waiting (rejects with the signal's reason): a service told to stop must not wait out a lock. */
  signal?: AbortSignal;
  /** Called once if the lock is held by someone else when first tried (for a log line). */
  onWait?: (owner: number) => void;
}

/**
 * Runs `fn` while holding `<path>.lock`, an exclusively created file holding the owner's
 * pid. A lock whose owner is dead (SIGKILLed bind) is broken, so a crash never wedges the
 * registry. Good enough for CLI read-modify-write of a small file by an operator; it is
 * not meant for high contention.
 */
export async function withFileLock<T>(path: string, fn: () => Promise<T>, options: LockOptions = {}): Promise<T> {
  const lockPath = `${path}.lock`;
  const deadline = Date.now() + (options.timeoutMs ?? 10_000);
  const retryMs = options.retryMs ?? 20;
  let waited = false;
  for (;;) {
    options.signal?.throwIfAborted();
    try {
      const fh = await open(lockPath, 'wx', 0o600);
      await fh.writeFile(String(process.pid));
      await fh.close();
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    // Bounded and non-blocking: a FIFO or a symlink planted as the lock (the hand-off's group
    // can create files beside it) reads as no owner, and is broken once old, never waited on.
    const owner = Number((await readBoundedRegularFile(lockPath, 64).then((f) => f.text, () => '')).trim());
    // An empty lock is a holder killed between create and write: stale once it is old.
    const emptyAndOld = owner === 0 && Date.now() - ((await lstat(lockPath).catch(() => undefined))?.mtimeMs ?? Date.now()) > 5_000;
    if ((Number.isInteger(owner) && owner > 0 && !processAlive(owner)) || emptyAndOld) {
      await unlink(lockPath).catch(() => undefined);
      continue;
    }
    if (!waited) {
      waited = true;
      options.onWait?.(owner);
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for lock ${lockPath} (held by pid ${owner || 'unknown'})`);
    // Jitter keeps two waiters from retrying in lockstep.
    await sleep(retryMs + Math.floor(Math.random() * retryMs), undefined, options.signal ? { signal: options.signal } : undefined);
  }
  try {
    return await fn();
  } finally {
    await unlink(lockPath).catch(() => undefined);
  }
}
