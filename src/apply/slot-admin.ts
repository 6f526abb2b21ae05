import { closeSync, constants, fchmodSync, fstatSync, lstatSync, openSync, readFileSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { emptySlotFile, readSlotFile, slotFileName, type HandoffPaths, type SlotFile } from '../data/handoff.js';
import { atomicWrite, atomicWriteSync, fsyncDir, tempPathFor } from '../fs/atomic-write.js';
import { deleteFile } from '../fs/delete-file.js';
import { ensureHandoffDir } from './handoff-dirs.js';

/**
 * The slot files this process knows to be valid and not revoked (it wrote or read them),
 * by path, with the file's identity then (inode, size, mtime and ctime in ns). A new state
 * then reads only the files it does not know: with 10 000 in force, one binding
 * disconnected read 10 000 slot files to find the revoked ones. Every write in slots/
 * (apply's, `bind`'s, a planted file) is a rename to a new inode or changes the size or
 * ctime, so a file someone else changed no longer matches and is read again. Per process:
 * at start (and after a power loss) it is empty and everything is read once.
 *
 * Beside the identity it keeps the content: apply compares each inbox file with the slot
 * in force, and reading and parsing the file it had itself written a moment before was a
 * fifth of its work per token. The same identity check decides whether that content is
 * still the file's. `delete` forgets both.
 */
class KnownSlots {
  readonly #good = new Map<string, string>();
  readonly #contents = new Map<string, { identity: string; slot: SlotFile }>();

  get(path: string): string | undefined {
    return this.#good.get(path);
  }

  set(path: string, identity: string): void {
    this.#good.set(path, identity);
  }

  delete(path: string): void {
    this.#good.delete(path);
    this.#contents.delete(path);
  }

  /** What the file at `path` held when its identity was `identity` (revoked or not). */
  keep(path: string, identity: string, slot: SlotFile): void {
    this.#contents.set(path, { identity, slot });
  }

  contentOf(path: string, identity: string): SlotFile | undefined {
    const kept = this.#contents.get(path);
    return kept?.identity === identity ? kept.slot : undefined;
  }
}
const knownGood = new KnownSlots();

function identityOf(path: string): string | undefined {
  const st = lstatSync(path, { bigint: true, throwIfNoEntry: false });
  return st?.isFile() ? `${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}` : undefined;
}

/** `identity`: taken before a read, so a file replaced after it fails the next match. */
function remember(path: string, slot: SlotFile | undefined, identity = identityOf(path)): void {
  if (slot && !slot.revoked && identity !== undefined) knownGood.set(path, identity);
  else knownGood.delete(path);
  if (slot && identity !== undefined) knownGood.keep(path, identity, slot);
}

function isKnownGood(path: string): boolean {
  const known = knownGood.get(path);
  if (known === undefined) return false;
  if (identityOf(path) === known) return true;
  knownGood.delete(path);
  return false;
}

/**
 * The slot in force, as `readSlotFile` returns it, without reading a file this process
 * wrote or read and nobody changed since: one lstat instead of a read and a parse. Only
 * apply writes slots/ while it runs, but `bind`, an operator or a planted file may too;
 * those change the identity and are read again. Anything but a regular file (missing, a
 * symlink, a FIFO) is left to `readSlotFile` to judge.
 */
export async function slotInForce(paths: HandoffPaths, slot: string): Promise<SlotFile | undefined> {
  const path = join(paths.slots, slotFileName(slot));
  const identity = identityOf(path);
  if (identity !== undefined) {
    const kept = knownGood.contentOf(path, identity);
    if (kept) return kept;
  }
  const read = await readSlotFile(paths, slot);
  // Unreadable or another slot's content: not kept, so it is judged again next time.
  if (read && identity !== undefined) remember(path, read, identity);
  return read;
}

export interface WriteSlotOptions {
  /**
   * slots/ was checked by the caller for this batch of writes (`ensureHandoffDir`): the
   * hand-off root is sticky, so the link cannot swap a checked directory for a symlink.
   */
  dirChecked?: boolean;
  /**
   * No fsync of the file: it is still whole or absent to every reader and across a crash
   * of the process, and the caller makes the rename durable with `fsyncDir(paths.slots)`.
   * For apply's inbox, whose token file is on disk before the slot file says it is
   * applied: after a power cut the slot file can only say less than what is on disk
   * (see `applyInbox`).
   */
  noFsync?: boolean;
}

export async function writeSlotFile(paths: HandoffPaths, slot: SlotFile, options: WriteSlotOptions = {}): Promise<void> {
  // Never through a symlink the link planted in place of slots/.
  if (!options.dirChecked) await ensureHandoffDir(paths, 'slots');
  const path = join(paths.slots, slotFileName(slot.slot));
  knownGood.delete(path);
  // 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it.
  if (options.noFsync) atomicWriteSync(path, `${JSON.stringify(slot)}\n`, { mode: 0o640 });
  else await atomicWrite(path, `${JSON.stringify(slot)}\n`, { mode: 0o640 });
  remember(path, slot);
}

export { deleteFile };

/** `bind`: make the slot known to fetch (no token yet → renewed at once). Idempotent. */
export async function ensureSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  const existing = await readSlotFile(paths, slot);
  if (existing && !existing.revoked) return false;
  await writeSlotFile(paths, existing ? { ...existing, revoked: undefined } : emptySlotFile(slot));
  return true;
}

/**
 * Each slot file is its own durable write (two fsyncs); one after the other, a state of
 * 10 000 new bindings spent minutes waiting on the disk. A few at a time keep the disk
 * busy without holding thousands of open files.
 */
const IN_FLIGHT = 16;
export async function eachInParallel<T>(items: readonly T[], fn: (item: T) => Promise<unknown>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(IN_FLIGHT, items.length) }, worker));
}

/** Between two runs of this many synchronous writes, the loop takes its other work (the watchdog, a signal). */
const SYNC_BATCH = 256;

export interface EnsureSlotsResult {
  /** The slots whose file was written (new, unreadable or revived). */
  written: string[];
  /** Slot files read: the present ones this process did not already know to be good. */
  read: number;
}

/**
 * `ensureSlot` for every slot of a desired state at once: each missing, unreadable or
 * revoked (unless `revive: false`) slot file is (re)written; `present` are the names listed in slots/ (a file not
 * there needs no read, nor does one this process knows unchanged since it wrote or read it). The new files are written whole-or-absent (temp + rename) without
 * an fsync each: 10 000 of them, two fsyncs apiece, took 10–50 s on a shared disk where the
 * goal is a state in force within 2 s. One fsync of slots/ makes the renames durable; a
 * file whose content a power loss lost is re-made by the next reconcile (apply runs one at
 * every start: `reconcileDesiredState`), before anything could need it.
 */
export async function ensureSlots(paths: HandoffPaths, slots: readonly string[], present: ReadonlySet<string>, options: { revive?: boolean } = {}): Promise<EnsureSlotsResult> {
  const write: SlotFile[] = [];
  const unknown = slots.filter((s) => present.has(s) && !isKnownGood(join(paths.slots, slotFileName(s))));
  await eachInParallel(unknown, async (slot) => {
    const path = join(paths.slots, slotFileName(slot));
    const identity = identityOf(path);
    const existing = await readSlotFile(paths, slot).catch(() => undefined);
    remember(path, existing, identity);
    if (!existing) write.push(emptySlotFile(slot));
    else if (existing.revoked && options.revive !== false) write.push({ ...existing, revoked: undefined });
  });
  for (const slot of slots) if (!present.has(slot)) write.push(emptySlotFile(slot));
  const result = { written: write.map((s) => s.slot), read: unknown.length };
  if (write.length === 0) return result;
  // Never through a symlink the link planted in place of slots/.
  await ensureHandoffDir(paths, 'slots');
  const writer = new NewSlotWriter(paths.slots);
  for (let i = 0; i < write.length; i++) {
    if (i > 0 && i % SYNC_BATCH === 0) await new Promise((resolve) => setImmediate(resolve));
    const slot = write[i]!;
    const name = slotFileName(slot.slot);
    const path = join(paths.slots, name);
    knownGood.delete(path);
    const text = `${JSON.stringify(slot)}\n`;
    if (present.has(slot.slot)) {
      // A file that was there (unreadable or revoked): atomicWriteSync refuses a symlink or a
      // non-regular file in its place, as before.
      atomicWriteSync(path, text, { mode: SLOT_FILE_MODE });
      remember(path, slot);
    } else {
      const identity = writer.write(name, text);
      if (identity !== undefined) knownGood.set(path, identity);
    }
  }
  await fsyncDir(paths.slots);
  return result;
}

/** 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it. */
const SLOT_FILE_MODE = 0o640;

/**
 * Whether this process's umask leaves `mode` as open() was given it (Linux: the Umask line
 * of /proc/self/status; `process.umask()` without an argument writes the umask twice, a
 * race with the thread pool's file creations). Unknown → false: chmod each file.
 */
function umaskKeeps(mode: number): boolean {
  try {
    const m = /^Umask:\s*([0-7]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'));
    return m !== null && (Number.parseInt(m[1]!, 8) & mode) === 0;
  } catch {
    return false;
  }
}

/**
 * Writes the slot files of a new state that were not in slots/ when it was listed: the
 * same whole-or-absent write as `atomicWriteSync` (a temp file opened exclusively,
 * O_NOFOLLOW, with the final mode, then renamed over the name), minus what 11 000 of them
 * do not need, each measured at tens of µs a file on this VM (the temp name is
 * atomicWrite's own, `tempPathFor`, so `sweepStaleTemps` removes what a killed apply left):
 * an `lstat` before, refusing a symlink at the name (the name was absent when
 * listed; one the link plants since is replaced by the rename, which never follows it,
 * not written through); the `fchmod` when the umask cannot have narrowed the mode; and an
 * `lstat` after, for the file's identity (`knownGood`): `fstat` of the still-open file
 * after the rename gives the same inode, size and times without a path lookup in a
 * directory of 11 000 names. Returns the identity, undefined if the fstat failed (the
 * file is then read on the next state, as any unknown one).
 */
class NewSlotWriter {
  private readonly chmod = !umaskKeeps(SLOT_FILE_MODE);

  constructor(private readonly dir: string) {}

  write(name: string, text: string): string | undefined {
    const path = join(this.dir, name);
    const tmp = tempPathFor(this.dir, name);
    const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, SLOT_FILE_MODE);
    let renamed = false;
    try {
      const bytes = Buffer.from(text);
      for (let off = 0; off < bytes.length; ) off += writeSync(fd, bytes, off);
      if (this.chmod) fchmodSync(fd, SLOT_FILE_MODE);
      renameSync(tmp, path);
      renamed = true;
      const st = fstatSync(fd, { bigint: true });
      return `${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
    } catch (err) {
      if (renamed) return undefined;
      try {
        unlinkSync(tmp);
      } catch {
        // never created or already gone
      }
      throw err;
    } finally {
      closeSync(fd);
    }
  }
}

/** `unbind` of the last binding of an instance: fetch stops renewing it. */
export function retireSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  const path = join(paths.slots, slotFileName(slot));
  knownGood.delete(path);
  return deleteFile(path);
}
