import { lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import { lstat, readdir, rename } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { atomicWrite, ownerFor, sweepStaleTemps } from '../fs/atomic-write.js';
import { readBoundedRegularFile, UnsafeFileError } from '../fs/bounded-read.js';
import { withFileLock } from '../fs/file-lock.js';
import type { Logger } from '../log/logger.js';
import { crashPoint } from '../service/test-hooks.js';
import {
  emptySlotFile,
  inboxFileSchema,
  readSlotFile,
  slotOfFileName,
  type HandoffPaths,
  type SlotFile,
} from '../data/handoff.js';
import { parseJsonWith } from '../data/parse.js';
import { ensureHandoffDir } from './handoff-dirs.js';
import { deleteFile, writeSlotFile } from './slot-admin.js';

/** An inbox file is one renewal answer (a token and its metadata): far below this. */
export const MAX_INBOX_FILE_BYTES = 64 * 1024;

export interface ApplyDeps {
  paths: HandoffPaths;
  tokenFilesFor: (slot: string) => Promise<string[]>;
  log: Logger;
  now?: () => number;
  /** A stop request: no more waiting for another apply's lock. */
  signal?: AbortSignal;
  /** Enrolled host (a desired state exists): tokens for slots with no slot file are dropped. */
  managed?: boolean;
  /**
   * Asked between two inbox files: true ends the pass there (what is left waits for the
   * next one). apply --watch says so when a new desired state arrived, so a disconnect is
   * not applied behind thousands of hand-offs.
   */
  interrupt?: () => boolean;
}

export interface ApplyStats {
  applied: number;
  ignored: number;
  rejected: number;
  /** The pass ended early for a new desired state (`interrupt`). */
  interrupted?: boolean;
}

/** Newer means a higher generation, or the same generation expiring later; and a new tokenId. */
export function isNewer(candidate: { tokenId: string; credentialGeneration: number; expiresAt: string }, applied: SlotFile): boolean {
  if (candidate.tokenId === applied.tokenId) return false;
  if (candidate.credentialGeneration !== applied.generation) return candidate.credentialGeneration > applied.generation;
  return applied.expiresAt === null || Date.parse(candidate.expiresAt) > Date.parse(applied.expiresAt);
}

/**
 * Removes an inbox file only if it is still the one we read: fetch writes by rename, so a
 * newer answer may have replaced it meanwhile, and that one must be applied, not deleted.
 */
async function removeIfSame(path: string, ino: number): Promise<boolean> {
  // Two system calls on a file apply just read: synchronous (once per token applied).
  const st = lstatSync(path, { throwIfNoEntry: false });
  if (!st || st.ino !== ino) return false;
  unlinkSync(path);
  return true;
}

/**
 * Moves a refused inbox entry (file, FIFO, symlink: rename moves the entry itself, never
 * what it points at) into rejected/, which must be apply's own real directory, checked
 * just before. Refused: the entry stays in the inbox (logged), never moved elsewhere.
 */
async function moveAside(deps: ApplyDeps, name: string, ino: number, stamp: string): Promise<void> {
  const { paths } = deps;
  const from = join(paths.inbox, name);
  const st = await lstat(from).catch(() => undefined);
  if (!st || st.ino !== ino) return;
  try {
    await ensureHandoffDir(paths, 'rejected');
  } catch (err) {
    deps.log.error({ file: name, reason: (err as Error).message }, 'rejected/ refused; the inbox file stays where it is');
    throw err;
  }
  // The inode makes the name unique: two rejections in one millisecond must not collide.
  await rename(from, join(paths.rejected, `${name}.${stamp}.${ino}.rejected`));
}

/**
 * Serialises work on the same paths: two slots whose registry entries name the same token
 * file (an operator's own tokenFile) must not write it at once, or the older token could
 * land last.
 */
class PathLocks {
  readonly #tails = new Map<string, Promise<void>>();

  async with<T>(paths: readonly string[], fn: () => Promise<T>): Promise<T> {
    const keys = [...new Set(paths)];
    const before = keys.map((k) => this.#tails.get(k) ?? Promise.resolve());
    let release: () => void = () => undefined;
    const mine = new Promise<void>((r) => (release = r));
    for (const k of keys) this.#tails.set(k, mine);
    try {
      await Promise.all(before);
      return await fn();
    } finally {
      release();
      for (const k of keys) if (this.#tails.get(k) === mine) this.#tails.delete(k);
    }
  }
}

/** One inbox file: validate → compare → token file(s) → slot file → remove. */
async function applyOne(deps: ApplyDeps, name: string, stats: ApplyStats, locks: PathLocks): Promise<void> {
  const { paths, log } = deps;
  const now = deps.now ?? Date.now;
  const path = join(paths.inbox, name);
  const slot = slotOfFileName(name);
  if (name.startsWith('.')) return; // a writer's temp file, not ours to touch

  let ino: number;
  let text: string;
  try {
    // No symlink followed, no FIFO waited on, nothing read past the bound (the link is not trusted).
    const file = await readBoundedRegularFile(path, MAX_INBOX_FILE_BYTES);
    ino = file.stat.ino;
    text = file.text;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    const reason = err instanceof UnsafeFileError ? err.reason : `unreadable (${code ?? 'error'})`;
    const st = await lstat(path).catch(() => undefined);
    if (st) await moveAside(deps, name, st.ino, stampOf(now()));
    stats.rejected += 1;
    log.error({ file: name, reason }, 'inbox file rejected; moved aside, not applied');
    return;
  }

  const parsed = parseJsonWith(inboxFileSchema, text);
  const reason = !slot ? 'file name is not <slot>.json' : !parsed.ok ? parsed.error : parsed.value.slot !== slot ? 'slot does not match the file name' : undefined;
  if (reason !== undefined || !parsed.ok || !slot) {
    await moveAside(deps, name, ino, stampOf(now()));
    stats.rejected += 1;
    log.error({ file: name, reason }, 'inbox file rejected; moved aside, not applied');
    return;
  }
  const msg = parsed.value;
  const inForce = await readSlotFile(paths, slot);
  const current = inForce ?? emptySlotFile(slot);

  if ('revoked' in msg) {
    // The token is dead upstream: it must not stay on disk (SPEC §8), whoever uses it.
    let deleted = 0;
    for (const file of await deps.tokenFilesFor(slot)) if (await deleteFile(file)) deleted += 1;
    await writeSlotFile(paths, { ...current, slot, revoked: true });
    await removeIfSame(path, ino);
    stats.applied += 1;
    log.warn({ slot, deletedTokenFiles: deleted }, 'slot marked revoked (the Gateway no longer knows it); its token file deleted');
    return;
  }
  if (deps.managed && !inForce) {
    // On an enrolled host the desired state decides the slots: a token for a slot it
    // retired (fetch's answer racing the retirement) is dropped, never written.
    await removeIfSame(path, ino);
    stats.ignored += 1;
    log.info({ slot }, 'inbox file for a slot that is not in force; dropped');
    return;
  }
  if (!isNewer(msg, current)) {
    await removeIfSame(path, ino);
    stats.ignored += 1;
    log.info({ slot, tokenId: msg.tokenId, appliedTokenId: current.tokenId }, 'inbox file is not newer than the applied token; ignored');
    return;
  }
  const files = await deps.tokenFilesFor(slot);
  await locks.with(files, async () => {
    for (const file of files) {
      mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
      await sweepOnce(dirname(file));
      await atomicWrite(file, `${msg.token}\n`, {
        mode: 0o600,
        owner: await ownerFor(dirname(file)),
        midWrite: () => crashPoint('apply-mid-token-write'),
      });
    }
    crashPoint('apply-after-token-write');
    await writeSlotFile(paths, {
      slot,
      tokenId: msg.tokenId,
      expiresAt: msg.expiresAt,
      generation: msg.credentialGeneration,
      appliedAt: new Date(now()).toISOString(),
    });
  });
  await removeIfSame(path, ino);
  stats.applied += 1;
  log.info({ slot, tokenId: msg.tokenId, expiresAt: msg.expiresAt, files: files.length }, 'token applied');
}

/**
 * Temps a killed apply left beside the token files (possibly part of a token) are swept
 * the first time this process writes into their directory: one listing per directory per
 * process, not one per token (10 000 tokens in one directory made that quadratic). Token
 * files are written only by apply, under the hand-off lock: a temp a dead apply leaves
 * later (a one-shot run killed beside this one) waits for this process's next start.
 */
const sweptDirs = new Map<string, Promise<unknown>>();
async function sweepOnce(dir: string): Promise<void> {
  // The promise is kept, so files applied at once share one sweep.
  let sweep = sweptDirs.get(dir);
  if (!sweep) {
    sweep = sweepStaleTemps(dir).catch((err: unknown) => {
      sweptDirs.delete(dir);
      throw err;
    });
    sweptDirs.set(dir, sweep);
  }
  await sweep;
}

function stampOf(ms: number): string {
  return new Date(ms).toISOString().replace(/[:.]/g, '-');
}

/**
 * Inbox files applied at once. Each is one slot's answer, written to that slot's own token
 * and slot files, so they do not touch each other; one at a time, apply wrote 20–40 tokens
 * a second (two fsynced atomic writes each, in series) and set the pace of a 10 000-binding
 * host's first renewals. Their directory fsyncs are shared (fsyncDir's group commit).
 */
export const INBOX_FILES_IN_FLIGHT = 32;

/**
 * Applies every inbox file, oldest name first, up to INBOX_FILES_IN_FLIGHT at once, under
 * the hand-off lock so a `.path` trigger and a manual run never interleave. Each file is
 * independent: one bad file is moved aside and the rest still apply.
 */
export async function applyInbox(deps: ApplyDeps): Promise<ApplyStats> {
  const stats: ApplyStats = { applied: 0, ignored: 0, rejected: 0 };
  try {
    await ensureHandoffDir(deps.paths, 'inbox');
  } catch (err) {
    // A symlinked inbox/ would have apply read and move files outside the hand-off.
    deps.log.error({ reason: (err as Error).message }, 'inbox/ refused; nothing applied from it');
    return stats;
  }
  const lock = {
    signal: deps.signal,
    onWait: (owner: number) => deps.log.info({ owner: owner || null }, 'waiting for another apply to finish'),
  };
  const locks = new PathLocks();
  await withFileLock(join(deps.paths.root, 'apply'), async () => {
    // Re-list until a round finds nothing new: a file renamed in while we worked would
    // otherwise wait for the next trigger (a systemd .path unit does not fire for a
    // service that is still running).
    const failed = new Set<string>();
    rounds: for (let round = 0; round < 10; round++) {
      const names = (await readdir(deps.paths.inbox)).filter((n) => !n.startsWith('.') && !failed.has(n)).sort();
      if (names.length === 0) break;
      const running = new Set<Promise<void>>();
      for (const name of names) {
        // Asked before each start: a new desired state waits for at most the files in flight.
        if (deps.interrupt?.()) {
          stats.interrupted = true;
          await Promise.all(running);
          break rounds;
        }
        if (running.size >= INBOX_FILES_IN_FLIGHT) await Promise.race(running);
        const one = applyOne(deps, name, stats, locks)
          .catch((err: unknown) => {
            failed.add(name);
            deps.log.error({ file: name, err: { message: (err as Error).message } }, 'could not apply inbox file; left in place for the next run');
          })
          .finally(() => running.delete(one));
        running.add(one);
      }
      await Promise.all(running);
    }
  }, lock);
  return stats;
}
