import { watch, type FSWatcher } from 'node:fs';
import { basename, dirname } from 'node:path';
import { readTokenFile } from './token-file.js';

/**
 * Waiting out a token rotation (SPEC §4). The Gateway honours only a slot's current
 * token, so between its minting a new one and apply renaming it into place, the old token
 * in the file is already refused. A request that got a 401 waits here for the file to hold
 * a different token, then retries once.
 *
 * Every request hitting the same rotation shares one watch per file: a rotation under load
 * costs one inotify watch and one timer, not one per request. The directory is watched,
 * not the file: apply replaces the file by rename, which a watch on the old inode never
 * reports. A short poll backs the watch up (an overflowed or failed watch must not turn a
 * rotation into a failed call), and the file is read only when something happened or the
 * poll fires.
 */

const POLL_MS = 100;

/** How long a request that got a 401 waits for a renewed token (SPEC §4: bounded, 5 s). */
export const DEFAULT_TOKEN_WAIT_MS = 5_000;

interface Waiter {
  rejected: string;
  deadline: number;
  resolve: (token: string | undefined) => void;
}

interface FileWatch {
  waiters: Set<Waiter>;
  watcher: FSWatcher | undefined;
  timer: NodeJS.Timeout;
}

export class TokenRotationWait {
  private readonly files = new Map<string, FileWatch>();

  /** Open file watches (one per token file with anyone waiting); for tests and metrics. */
  get watching(): number {
    return this.files.size;
  }

  /**
   * Resolves with the file's new token once it differs from `rejected`, or undefined when
   * `timeoutMs` passes, the file stays unreadable, or `signal` aborts (the agent left).
   */
  waitForChange(path: string, rejected: string, timeoutMs: number, signal?: AbortSignal): Promise<string | undefined> {
    const now = readTokenFile(path);
    if (now.ok && now.token !== rejected) return Promise.resolve(now.token);
    if (timeoutMs <= 0 || signal?.aborted) return Promise.resolve(undefined);
    return new Promise((resolve) => {
      const entry = this.files.get(path) ?? this.open(path);
      const waiter: Waiter = {
        rejected,
        deadline: Date.now() + timeoutMs,
        resolve: (token) => {
          signal?.removeEventListener('abort', onAbort);
          entry.waiters.delete(waiter);
          if (entry.waiters.size === 0) this.close(path, entry);
          resolve(token);
        },
      };
      const onAbort = (): void => waiter.resolve(undefined);
      signal?.addEventListener('abort', onAbort, { once: true });
      entry.waiters.add(waiter);
    });
  }

  private open(path: string): FileWatch {
    const name = basename(path);
    const entry: FileWatch = {
      waiters: new Set(),
      watcher: undefined,
      timer: setInterval(() => this.check(path, entry), POLL_MS),
    };
    try {
      entry.watcher = watch(dirname(path), { persistent: false }, (_event, file) => {
        if (file === null || file === name) this.check(path, entry);
      });
      entry.watcher.on('error', () => {
        entry.watcher?.close();
        entry.watcher = undefined;
      });
    } catch {
      // No watch (directory gone, inotify limit): the poll alone still bounds the wait.
    }
    this.files.set(path, entry);
    return entry;
  }

  private check(path: string, entry: FileWatch): void {
    const read = readTokenFile(path);
    const now = Date.now();
    for (const w of [...entry.waiters]) {
      if (read.ok && read.token !== w.rejected) w.resolve(read.token);
      else if (now >= w.deadline) w.resolve(undefined);
    }
  }

  private close(path: string, entry: FileWatch): void {
    clearInterval(entry.timer);
    entry.watcher?.close();
    if (this.files.get(path) === entry) this.files.delete(path);
  }
}

/**
 * A proxy's wait for a renewed token on behalf of one request: ends early when the agent
 * leaves (`res` closes). Resolves with the new token, or undefined.
 */
export async function waitForRenewedToken(
  rotation: TokenRotationWait,
  path: string,
  rejected: string,
  timeoutMs: number,
  res: { once(event: 'close', fn: () => void): unknown; off(event: 'close', fn: () => void): unknown },
): Promise<string | undefined> {
  const left = new AbortController();
  const onClose = (): void => left.abort();
  res.once('close', onClose);
  try {
    return await rotation.waitForChange(path, rejected, timeoutMs, left.signal);
  } finally {
    res.off('close', onClose);
  }
}
