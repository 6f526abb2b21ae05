import { watch, type FSWatcher } from 'node:fs';
import { basename, dirname } from 'node:path';
import { readTokenFile, type TokenRead } from './token-file.js';

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
 *
 * A wait also ends the moment waiting can no longer help: the token file is deleted
 * (apply retires a slot's file when its binding or provider is disconnected) or the route
 * is gone from the reloaded registry/catalog. The request then answers what a new request
 * would (503 token_unavailable, 404), not token_rejected after the full bound.
 */

const POLL_MS = 100;

/** How long a request that got a 401 waits for a renewed token (SPEC §4: bounded, 5 s). */
export const DEFAULT_TOKEN_WAIT_MS = 5_000;

/**
 * Retries of one request after 401s, each with a token the file newly holds. The time bound
 * (--token-wait-ms) ends a wait; this ends a file that keeps changing to refused tokens
 * (real renewals come minutes apart: one retry, rarely two).
 */
export const MAX_TOKEN_RETRIES = 10;

/**
 * How a wait ended: a renewed token; the file deleted; the route gone from the config
 * (`routed` said so); the bound passed (or the file stayed unreadable); the agent left.
 */
export type WaitEnd =
  | { kind: 'renewed'; token: string }
  | { kind: 'deleted' }
  | { kind: 'unrouted' }
  | { kind: 'timeout' }
  | { kind: 'left' };

export interface WaitOptions {
  /** Aborts when the agent leaves. */
  signal?: AbortSignal | undefined;
  /** Whether the request's route is still configured; asked on every check (cheap: a map lookup). */
  routed?: (() => boolean) | undefined;
}

interface Waiter {
  rejected: string;
  deadline: number;
  routed: (() => boolean) | undefined;
  end: (end: WaitEnd) => void;
}

const LEFT: WaitEnd = { kind: 'left' };
const TIMEOUT: WaitEnd = { kind: 'timeout' };
const DELETED: WaitEnd = { kind: 'deleted' };
const UNROUTED: WaitEnd = { kind: 'unrouted' };

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
   * Ends once the file holds a token other than `rejected`, the file is deleted, the route
   * is gone, `timeoutMs` passes, or `signal` aborts.
   */
  waitForChange(path: string, rejected: string, timeoutMs: number, opts: WaitOptions = {}): Promise<WaitEnd> {
    const { signal, routed } = opts;
    const first = ended(readTokenFile(path), rejected, routed);
    if (first) return Promise.resolve(first);
    if (signal?.aborted) return Promise.resolve(LEFT);
    if (timeoutMs <= 0) return Promise.resolve(TIMEOUT);
    return new Promise((resolve) => {
      const entry = this.files.get(path) ?? this.open(path);
      const waiter: Waiter = {
        rejected,
        deadline: Date.now() + timeoutMs,
        routed,
        end: (end) => {
          signal?.removeEventListener('abort', onAbort);
          entry.waiters.delete(waiter);
          if (entry.waiters.size === 0) this.close(path, entry);
          resolve(end);
        },
      };
      const onAbort = (): void => waiter.end(LEFT);
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
      const end = ended(read, w.rejected, w.routed);
      if (end) w.end(end);
      else if (now >= w.deadline) w.end(TIMEOUT);
    }
  }

  private close(path: string, entry: FileWatch): void {
    clearInterval(entry.timer);
    entry.watcher?.close();
    if (this.files.get(path) === entry) this.files.delete(path);
  }
}

/**
 * What ends a wait early, given one read of the file. Only a missing file counts as
 * deleted: apply renames a complete file into place, so a file that is empty or unreadable
 * is someone else's write in progress, worth waiting out.
 */
function ended(read: TokenRead, rejected: string, routed: (() => boolean) | undefined): WaitEnd | undefined {
  if (read.ok && read.token !== rejected) return { kind: 'renewed', token: read.token };
  if (routed && !routed()) return UNROUTED;
  if (!read.ok && read.reason === 'missing') return DELETED;
  return undefined;
}

/**
 * A proxy's wait for a renewed token on behalf of one request: ends early when the agent
 * leaves (`res` closes) or the route is gone (`routed`).
 */
export async function waitForRenewedToken(
  rotation: TokenRotationWait,
  path: string,
  rejected: string,
  timeoutMs: number,
  res: { once(event: 'close', fn: () => void): unknown; off(event: 'close', fn: () => void): unknown },
  routed: () => boolean,
): Promise<WaitEnd> {
  const left = new AbortController();
  const onClose = (): void => left.abort();
  res.once('close', onClose);
  try {
    return await rotation.waitForChange(path, rejected, timeoutMs, { signal: left.signal, routed });
  } finally {
    res.off('close', onClose);
  }
}
