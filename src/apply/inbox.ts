import { closeSync, constants, fchmodSync, fchownSync, fsync, lstatSync, mkdirSync, openSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { lstat, readdir, rename } from 'node:fs/promises';
import { promisify } from 'node:util';
import { basename, dirname, join } from 'node:path';
import { atomicWrite, fsyncDir, ownerFor, sweepStaleTemps, tempPathFor } from '../fs/atomic-write.js';
import { readBoundedRegularFile, UnsafeFileError } from '../fs/bounded-read.js';
import { withFileLock } from '../fs/file-lock.js';
import type { Logger } from '../log/logger.js';
import { crashPoint } from '../service/test-hooks.js';
import {
  emptySlotFile,
  inboxBatchSchema,
  inboxFileSchema,
  isBatchFileName,
  MAX_BATCH_FILE_BYTES,
  slotOfFileName,
  type HandoffPaths,
  type InboxFile,
  type SlotFile,
} from '../data/handoff.js';
import { checkWith, parseJsonWith } from '../data/parse.js';
import type { RenewOk } from '../data/renew-wire.js';
import { ensureHandoffDir } from './handoff-dirs.js';
import { deleteFile, slotInForce, writeSlotFile } from './slot-admin.js';

/** An inbox file is one renewal answer (a token and its metadata): far below this. */
export const MAX_INBOX_FILE_BYTES = 64 * 1024;

export interface ApplyDeps {
  paths: HandoffPaths;
  /**
   * The token files of a slot. `round` is the same object for every file of one round: the
   * registry and the catalog may be looked at once per round instead of once per token.
   */
  tokenFilesFor: (slot: string, round?: object) => Promise<string[]>;
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
  /**
   * The names to take in the next round instead of listing inbox/ (apply --watch: the
   * names its watcher reported since the last round); `undefined` lists the directory
   * (the first pass, a periodic rescan, an event without a name). Asked once per round;
   * an empty list ends the pass.
   */
  nextNames?: () => readonly string[] | undefined;
}

export interface ApplyStats {
  applied: number;
  ignored: number;
  rejected: number;
  /** The pass ended early for a new desired state (`interrupt`). */
  interrupted?: boolean;
  /** Files that could not be applied and were left in the inbox for the next pass. */
  failed?: number;
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

/**
 * What one round looks up once instead of once per file: the directories made, their
 * owners, slots/ checked. A round is short (it ends where the names listed end), so a
 * directory removed during it costs that file a retry on the next pass, nothing worse.
 */
interface Round {
  madeDirs: Set<string>;
  owners: Map<string, Promise<{ uid: number; gid: number } | undefined>>;
  /** slots/ passed `ensureHandoffDir` at the start of this round. */
  slotsChecked: boolean;
}

async function newRound(deps: ApplyDeps): Promise<Round> {
  let slotsChecked = true;
  try {
    await ensureHandoffDir(deps.paths, 'slots');
  } catch {
    // Each write checks again and fails on its own: the file stays in the inbox.
    slotsChecked = false;
  }
  return { madeDirs: new Set(), owners: new Map(), slotsChecked };
}

function ownerOnce(round: Round, dir: string): Promise<{ uid: number; gid: number } | undefined> {
  let owner = round.owners.get(dir);
  if (!owner) round.owners.set(dir, (owner = ownerFor(dir)));
  return owner;
}

/**
 * An inbox entry's text and inode, or undefined: gone (nothing to do), or refused unread
 * (a symlink, a FIFO, past the bound, unreadable), then moved aside and counted. No symlink
 * is followed, no FIFO waited on, nothing read past the bound: the link is not trusted.
 */
async function readInboxEntry(deps: ApplyDeps, name: string, maxBytes: number, stats: ApplyStats, what: 'inbox file' | 'inbox batch'): Promise<{ ino: number; text: string } | undefined> {
  const path = join(deps.paths.inbox, name);
  try {
    const file = await readBoundedRegularFile(path, maxBytes);
    return { ino: file.stat.ino, text: file.text };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return undefined;
    const reason = err instanceof UnsafeFileError ? err.reason : `unreadable (${code ?? 'error'})`;
    const st = await lstat(path).catch(() => undefined);
    if (st) await moveAside(deps, name, st.ino, stampOf((deps.now ?? Date.now)()));
    stats.rejected += 1;
    deps.log.error({ file: name, reason }, `${what} rejected; moved aside, not applied`);
    return undefined;
  }
}

/** One inbox file: validate → compare → token file(s) → slot file → remove. */
async function applyOne(deps: ApplyDeps, name: string, stats: ApplyStats, locks: PathLocks, round: Round): Promise<void> {
  const { paths, log } = deps;
  const now = deps.now ?? Date.now;
  const path = join(paths.inbox, name);
  const slot = slotOfFileName(name);
  if (name.startsWith('.')) return; // a writer's temp file, not ours to touch

  const read = await readInboxEntry(deps, name, MAX_INBOX_FILE_BYTES, stats, 'inbox file');
  if (!read) return;
  const { ino, text } = read;

  const parsed = parseJsonWith(inboxFileSchema, text);
  const reason = !slot ? 'file name is not <slot>.json' : !parsed.ok ? parsed.error : parsed.value.slot !== slot ? 'slot does not match the file name' : undefined;
  if (reason !== undefined || !parsed.ok || !slot) {
    await moveAside(deps, name, ino, stampOf(now()));
    stats.rejected += 1;
    log.error({ file: name, reason }, 'inbox file rejected; moved aside, not applied');
    return;
  }
  const msg = parsed.value;
  const plan = await planEntry(deps, msg, stats, round, 'inbox file');
  if (plan.kind === 'skip') {
    await removeIfSame(path, ino);
    return;
  }
  if (plan.kind === 'revoke') {
    // The token is dead upstream: it must not stay on disk (SPEC §8), whoever uses it.
    let deleted = 0;
    for (const file of await deps.tokenFilesFor(slot, round)) if (await deleteFile(file)) deleted += 1;
    await writeSlotFile(paths, { ...plan.current, slot, revoked: true }, { dirChecked: round.slotsChecked });
    await removeIfSame(path, ino);
    stats.applied += 1;
    log.warn({ slot, deletedTokenFiles: deleted }, 'slot marked revoked (the Gateway no longer knows it); its token file deleted');
    return;
  }
  // A new desired state came while this file waited its turn: nothing written yet, so it
  // stays in the inbox for the pass after the reconcile (a disconnect waits only for the
  // files already writing, not for every file started).
  if (deps.interrupt?.()) {
    stats.interrupted = true;
    return;
  }
  const { files, msg: answer } = plan;
  await locks.with(files, async () => {
    for (const file of files) {
      const dir = dirname(file);
      if (!round.madeDirs.has(dir)) {
        mkdirSync(dir, { recursive: true, mode: 0o700 });
        round.madeDirs.add(dir);
      }
      await sweepOnce(dir);
      // fsynced, file and directory: the token is on disk before the slot file says so.
      await atomicWrite(file, `${answer.token}\n`, {
        mode: 0o600,
        owner: await ownerOnce(round, dir),
        midWrite: () => crashPoint('apply-mid-token-write'),
      });
    }
    crashPoint('apply-after-token-write');
    // The slot file without an fsync of its own, the rename made durable by slots/'s
    // shared fsync below (see `applyInbox` for why that is enough).
    await writeSlotFile(
      paths,
      {
        slot,
        tokenId: answer.tokenId,
        expiresAt: answer.expiresAt,
        generation: answer.credentialGeneration,
        appliedAt: new Date(now()).toISOString(),
      },
      { dirChecked: round.slotsChecked, noFsync: true },
    );
  });
  await fsyncDir(paths.slots);
  await removeIfSame(path, ino);
  stats.applied += 1;
  log.info({ slot, tokenId: answer.tokenId, expiresAt: answer.expiresAt, files: files.length }, 'token applied');
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

const fsyncFd = promisify(fsync);

/**
 * A bad batch entry, kept for the operator as a file of its own in rejected/ (the rest of
 * its batch is applied). The name is the batch's and the entry's index, with the batch's
 * inode: a batch applied again after a crash rewrites the same file instead of adding one.
 */
async function rejectEntry(deps: ApplyDeps, batch: string, ino: number, index: number, entry: unknown): Promise<void> {
  await ensureHandoffDir(deps.paths, 'rejected');
  await atomicWrite(join(deps.paths.rejected, `${batch}.${index}.${ino}.rejected`), `${JSON.stringify(entry)}\n`, { mode: 0o600 });
}

/** A token file's new content written to its temp name, still open for the batch's fsync. */
interface StagedFile {
  path: string;
  tmp: string;
  /** Closed (-1) once fsynced. */
  fd: number;
}

/**
 * Writes a token file's temp (atomicWrite's name, so `sweepStaleTemps` removes one a killed
 * apply left): exclusive, O_NOFOLLOW, the final mode and owner. Not fsynced here: the batch
 * fsyncs its temps together (`applyWave`).
 */
function stageTokenFile(path: string, token: string, owner: { uid: number; gid: number } | undefined): StagedFile {
  const st = lstatSync(path, { throwIfNoEntry: false });
  // As atomicWrite: a symlink or a non-regular file at the target is refused, not replaced.
  if (st && !st.isFile()) throw new Error(`refusing to replace ${st.isSymbolicLink() ? 'symlink' : 'non-regular file'} at ${path}`);
  const tmp = tempPathFor(dirname(path), basename(path));
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    const bytes = Buffer.from(`${token}\n`);
    const half = Math.floor(bytes.length / 2);
    for (let off = 0; off < half; ) off += writeSync(fd, bytes, off, half - off);
    crashPoint('apply-mid-token-write');
    for (let off = half; off < bytes.length; ) off += writeSync(fd, bytes, off);
    fchmodSync(fd, 0o600);
    if (owner) fchownSync(fd, owner.uid, owner.gid);
  } catch (err) {
    closeSync(fd);
    unlinkTemp(tmp);
    throw err;
  }
  return { path, tmp, fd };
}

function unlinkTemp(tmp: string): void {
  try {
    unlinkSync(tmp);
  } catch {
    // already renamed or never made
  }
}

async function fsyncStaged(s: StagedFile): Promise<void> {
  await fsyncFd(s.fd);
  const fd = s.fd;
  s.fd = -1;
  closeSync(fd);
}

function closeStaged(s: StagedFile): void {
  if (s.fd === -1) return;
  try {
    closeSync(s.fd);
  } catch {
    // closed already
  }
  s.fd = -1;
}

/** What one valid answer comes to. */
type EntryPlan =
  | { kind: 'revoke'; slot: string; current: SlotFile }
  | { kind: 'write'; slot: string; msg: RenewOk; files: string[] }
  | { kind: 'skip' };

/**
 * What one valid answer comes to (a per-slot file's or a batch entry's: the same rules),
 * decided before anything is written; a skip is counted and logged here. `what` names it
 * in the log line.
 */
async function planEntry(deps: ApplyDeps, msg: InboxFile, stats: ApplyStats, round: Round, what: 'inbox file' | 'inbox entry' = 'inbox entry'): Promise<EntryPlan> {
  const { slot } = msg;
  const inForce = await slotInForce(deps.paths, slot);
  const current = inForce ?? emptySlotFile(slot);
  if ('revoked' in msg) return { kind: 'revoke', slot, current };
  if (deps.managed && !inForce) {
    // On an enrolled host the desired state decides the slots: a token for a slot it
    // retired (fetch's answer racing the retirement) is dropped, never written.
    stats.ignored += 1;
    deps.log.info({ slot }, `${what} for a slot that is not in force; dropped`);
    return { kind: 'skip' };
  }
  if (!isNewer(msg, current)) {
    stats.ignored += 1;
    deps.log.info({ slot, tokenId: msg.tokenId, appliedTokenId: current.tokenId }, `${what} is not newer than the applied token; ignored`);
    return { kind: 'skip' };
  }
  return { kind: 'write', slot, msg, files: await deps.tokenFilesFor(slot, round) };
}

/** See `applyWave`: between two loop turns, at most this many slot files written. */
const SLOT_WRITES_PER_TURN = 256;

/**
 * One wave of a batch: at most one entry per slot, so the entries do not depend on each
 * other. Tokens first, each on disk before its slot file says so; then the slot files.
 *
 * The fsyncs, batched: every token of the wave is written to its temp, the temps are
 * fsynced together (the kernel flushes them in one or a few journal commits, where one
 * atomicWrite after another waited for a commit each), renamed in, and each token
 * directory fsynced once, after every rename in it. A crash anywhere in between leaves
 * the old token file or the new one whole (a rename is atomic; a temp never renamed is
 * swept at the next start), the slot files unchanged, and the batch in the inbox: the
 * next pass applies it again. Two entries naming the same token file (an operator's own
 * tokenFile shared by two slots) are renamed in entry order, so the later entry's token
 * is what the file holds, as when the later file was applied last.
 */
async function applyWave(deps: ApplyDeps, wave: readonly InboxFile[], stats: ApplyStats, round: Round): Promise<void> {
  const { paths, log } = deps;
  const now = deps.now ?? Date.now;
  const plans = await Promise.all(wave.map((msg) => planEntry(deps, msg, stats, round)));
  const writes = plans.filter((p): p is Extract<EntryPlan, { kind: 'write' }> => p.kind === 'write');
  const staged: StagedFile[] = [];
  let renamed = 0;
  try {
    for (const plan of writes) {
      for (const file of plan.files) {
        const dir = dirname(file);
        if (!round.madeDirs.has(dir)) {
          mkdirSync(dir, { recursive: true, mode: 0o700 });
          round.madeDirs.add(dir);
        }
        await sweepOnce(dir);
        staged.push(stageTokenFile(file, plan.msg.token, await ownerOnce(round, dir)));
      }
    }
    // allSettled: no descriptor left open behind a failed fsync.
    const synced = await Promise.allSettled(staged.map((s) => fsyncStaged(s)));
    for (const r of synced) if (r.status === 'rejected') throw r.reason;
    for (const s of staged) {
      renameSync(s.tmp, s.path);
      renamed += 1;
    }
  } finally {
    // A failure leaves no temp behind (what was renamed is whole; the batch is applied again).
    for (const s of staged.slice(renamed)) {
      closeStaged(s);
      unlinkTemp(s.tmp);
    }
  }
  await Promise.all([...new Set(writes.flatMap((p) => p.files.map((f) => dirname(f))))].map((dir) => fsyncDir(dir)));
  if (writes.length > 0) crashPoint('apply-after-token-write');

  const revokedDirs = new Set<string>();
  let slotWrites = 0;
  for (const plan of plans) {
    // A loop turn every SLOT_WRITES_PER_TURN slot files: a wave of 32 batches holds up to
    // 16 384, each write ≈ 5 inotify events on slots/ for apply's own watch (`ensureSlots`),
    // whose queue (16 384 by default) overflows silently when it is not read.
    if (plan.kind !== 'skip' && ++slotWrites % SLOT_WRITES_PER_TURN === 0) await new Promise((resolve) => setImmediate(resolve));
    if (plan.kind === 'revoke') {
      // The token is dead upstream: it must not stay on disk (SPEC §8), whoever uses it.
      let deleted = 0;
      for (const file of await deps.tokenFilesFor(plan.slot, round)) {
        revokedDirs.add(dirname(file));
        if (await deleteFile(file)) deleted += 1;
      }
      await writeSlotFile(paths, { ...plan.current, slot: plan.slot, revoked: true }, { dirChecked: round.slotsChecked, noFsync: true });
      stats.applied += 1;
      log.warn({ slot: plan.slot, deletedTokenFiles: deleted }, 'slot marked revoked (the Gateway no longer knows it); its token file deleted');
    } else if (plan.kind === 'write') {
      const { msg } = plan;
      // Without an fsync each: slots/'s one fsync below makes them durable (see `applyInbox`).
      await writeSlotFile(
        paths,
        { slot: plan.slot, tokenId: msg.tokenId, expiresAt: msg.expiresAt, generation: msg.credentialGeneration, appliedAt: new Date(now()).toISOString() },
        { dirChecked: round.slotsChecked, noFsync: true },
      );
      stats.applied += 1;
      log.info({ slot: plan.slot, tokenId: msg.tokenId, expiresAt: msg.expiresAt, files: plan.files.length }, 'token applied');
    }
  }
  // The deletions and every slot file durable before the batch is removed (a deletion a
  // power cut undid is redone when the batch is applied again).
  await Promise.all([...revokedDirs].map((dir) => fsyncDir(dir).catch(() => undefined)));
  if (plans.some((p) => p.kind !== 'skip')) await fsyncDir(paths.slots);
}

/** A batch read and checked: its inode (for the removal) and its valid entries, in order. */
interface ReadBatch {
  name: string;
  ino: number;
  entries: InboxFile[];
  bytes: number;
}

/**
 * One inbox batch (`inbox/batch-*.json`, the link's group commit), hostile input as a
 * single file is: read bounded (no symlink, no FIFO, the size bound), the envelope parsed,
 * then each entry checked on its own: a bad entry is rejected alone (logged, kept in
 * rejected/), the rest returned to be applied exactly as a single file is. An unreadable
 * or unparseable batch is moved aside whole (undefined).
 */
async function readBatch(deps: ApplyDeps, name: string, stats: ApplyStats): Promise<ReadBatch | undefined> {
  const { log } = deps;
  const now = deps.now ?? Date.now;
  const read = await readInboxEntry(deps, name, MAX_BATCH_FILE_BYTES, stats, 'inbox batch');
  if (!read) return undefined;
  const { ino, text } = read;
  const parsed = parseJsonWith(inboxBatchSchema, text);
  if (!parsed.ok) {
    await moveAside(deps, name, ino, stampOf(now()));
    stats.rejected += 1;
    log.error({ file: name, reason: parsed.error }, 'inbox batch rejected; moved aside, not applied');
    return undefined;
  }
  const entries: InboxFile[] = [];
  for (const [index, entry] of parsed.value.entries.entries()) {
    const checked = checkWith(inboxFileSchema, entry);
    if (checked.ok) {
      entries.push(checked.value);
      continue;
    }
    await rejectEntry(deps, name, ino, index, entry);
    stats.rejected += 1;
    log.error({ file: name, entry: index, reason: checked.error }, 'inbox batch entry rejected; kept in rejected/, the rest of the batch applied');
  }
  return { name, ino, entries, bytes: text.length };
}

/** Batches applied together: as many as per-slot files are applied at once (INBOX_FILES_IN_FLIGHT), within a byte budget. */
const BATCHES_AT_ONCE = 32;
const BATCH_GROUP_BYTES = 8 * 1024 * 1024;

/**
 * Several batches applied as one: their entries, in name order then entry order, split into
 * waves (a slot's second entry goes in the next wave, so each wave's entries are independent
 * and a slot's entries are judged by `isNewer` in the order they were written), each wave's
 * fsyncs shared (`applyWave`). One batch at a time paid a wave's three fsync rounds for a
 * handful of answers; per-slot files, 32 at once, had shared theirs across 32. The batches
 * are removed once every wave is on disk; a crash before applies them again on the next
 * pass (idempotent by `isNewer`). Returns false when a new desired state interrupted it
 * (before a wave: nothing of it written; the batches stay).
 */
async function applyBatches(deps: ApplyDeps, names: readonly string[], stats: ApplyStats, round: Round): Promise<boolean> {
  const read: ReadBatch[] = [];
  for (const name of names) {
    const batch = await readBatch(deps, name, stats);
    if (batch) read.push(batch);
  }
  const waves: InboxFile[][] = [];
  const seen = new Map<string, number>();
  for (const entry of read.flatMap((b) => b.entries)) {
    const n = seen.get(entry.slot) ?? 0;
    seen.set(entry.slot, n + 1);
    (waves[n] ??= []).push(entry);
  }
  for (const wave of waves) {
    if (deps.interrupt?.()) {
      stats.interrupted = true;
      return false;
    }
    await applyWave(deps, wave, stats, round);
  }
  for (const b of read) await removeIfSame(join(deps.paths.inbox, b.name), b.ino);
  return true;
}

/** The next group of batch names: up to BATCHES_AT_ONCE, and within BATCH_GROUP_BYTES by their size on disk. */
function nextBatchGroup(inbox: string, names: readonly string[], from: number): string[] {
  const group: string[] = [];
  let bytes = 0;
  for (let i = from; i < names.length && group.length < BATCHES_AT_ONCE; i++) {
    const name = names[i] as string;
    const size = lstatSync(join(inbox, name), { throwIfNoEntry: false })?.size ?? 0;
    if (group.length > 0 && bytes + size > BATCH_GROUP_BYTES) break;
    bytes += size;
    group.push(name);
  }
  return group;
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
 * Applies every inbox file under the hand-off lock, so a `.path` trigger and a manual run
 * never interleave: per-slot files (a previous link's) oldest name first, up to
 * INBOX_FILES_IN_FLIGHT at once, then the batches one after the other in name order
 * (`applyBatches`, up to 32 together; the durability argument is `applyWave`'s). Each file is independent: one
 * bad file is moved aside, one bad batch entry rejected alone, and the rest still apply.
 * What follows is the per-slot file's durability; a batch's is the same per entry.
 *
 * Durability, per token: the token file is fsynced (file and directory) before the slot
 * file is written; the slot file is renamed into place without an fsync of its own, and
 * one fsync of slots/, shared by every file of the round that reached it (`fsyncDir`'s
 * group commit), makes the renames durable before each inbox file is removed. So the
 * inbox file goes only once its token is on disk (as before), and a power cut can leave a
 * slot file that says less than what is on disk (its previous content, or, on a file
 * system that does not order a renamed file's data before the rename, an empty file),
 * never more: an older record only makes fetch renew that slot sooner, and an unreadable
 * one is re-made by the reconcile apply runs at every start (`ensureSlots`) and renewed at
 * once. The one thing the lost record weakens is `isNewer` against a replay of a token
 * older than the one on disk but newer than the record, until that slot's next renewal.
 * One fsync less per token: half of what apply waited on the disk for.
 */
export async function applyInbox(deps: ApplyDeps): Promise<ApplyStats> {
  const stats: ApplyStats = { applied: 0, ignored: 0, rejected: 0 };
  // Woken with no new name (its own removals, a desired state): no lock, no listing.
  let first = deps.nextNames?.();
  if (first?.length === 0) return stats;
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
    rounds: for (let i = 0; i < 10; i++) {
      const given = i === 0 ? first : deps.nextNames?.();
      first = undefined;
      const names = (given ?? (await readdir(deps.paths.inbox))).filter((n) => !n.startsWith('.') && !failed.has(n)).sort();
      if (names.length === 0) break;
      const round = await newRound(deps);
      const running = new Set<Promise<void>>();
      // Per-slot files (a link before the batches left them at upgrade, or junk to move
      // aside) first, 32 at once as before; then the batches, one after the other in name
      // (write) order, never beside a per-slot file: each batch's entries are applied
      // together, and two passes over one slot at once could land the older token last.
      const batches = names.filter(isBatchFileName);
      for (const name of names.filter((n) => !isBatchFileName(n))) {
        // Asked before each start: a new desired state waits for at most the files in flight.
        if (deps.interrupt?.()) {
          stats.interrupted = true;
          await Promise.all(running);
          break rounds;
        }
        if (running.size >= INBOX_FILES_IN_FLIGHT) await Promise.race(running);
        const one = applyOne(deps, name, stats, locks, round)
          .catch((err: unknown) => {
            failed.add(name);
            stats.failed = (stats.failed ?? 0) + 1;
            deps.log.error({ file: name, err: { message: (err as Error).message } }, 'could not apply inbox file; left in place for the next run');
          })
          .finally(() => running.delete(one));
        running.add(one);
      }
      await Promise.all(running);
      for (let at = 0; at < batches.length; ) {
        if (deps.interrupt?.()) {
          stats.interrupted = true;
          break rounds;
        }
        const group = nextBatchGroup(deps.paths.inbox, batches, at);
        at += group.length;
        try {
          if (!(await applyBatches(deps, group, stats, round))) break rounds;
        } catch (err) {
          for (const name of group) failed.add(name);
          stats.failed = (stats.failed ?? 0) + group.length;
          deps.log.error({ files: group.length, first: group[0], err: { message: (err as Error).message } }, 'could not apply inbox batches; left in place for the next run');
        }
      }
    }
  }, lock);
  return stats;
}
