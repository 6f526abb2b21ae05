import { lstatSync } from 'node:fs';
import { join } from 'node:path';
import { emptySlotFile, readSlotFile, slotFileName, type HandoffPaths, type SlotFile } from '../data/handoff.js';
import { atomicWrite, atomicWriteSync, fsyncDir } from '../fs/atomic-write.js';
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
 */
const knownGood = new Map<string, string>();

function identityOf(path: string): string | undefined {
  const st = lstatSync(path, { bigint: true, throwIfNoEntry: false });
  return st?.isFile() ? `${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}` : undefined;
}

/** `identity`: taken before a read, so a file replaced after it fails the next match. */
function remember(path: string, slot: SlotFile | undefined, identity = identityOf(path)): void {
  if (slot && !slot.revoked && identity !== undefined) knownGood.set(path, identity);
  else knownGood.delete(path);
}

function isKnownGood(path: string): boolean {
  const known = knownGood.get(path);
  if (known === undefined) return false;
  if (identityOf(path) === known) return true;
  knownGood.delete(path);
  return false;
}

export async function writeSlotFile(paths: HandoffPaths, slot: SlotFile): Promise<void> {
  // Never through a symlink the link planted in place of slots/.
  await ensureHandoffDir(paths, 'slots');
  const path = join(paths.slots, slotFileName(slot.slot));
  knownGood.delete(path);
  // 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it.
  await atomicWrite(path, `${JSON.stringify(slot)}\n`, { mode: 0o640 });
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
  for (let i = 0; i < write.length; i++) {
    if (i > 0 && i % SYNC_BATCH === 0) await new Promise((resolve) => setImmediate(resolve));
    const slot = write[i]!;
    const path = join(paths.slots, slotFileName(slot.slot));
    knownGood.delete(path);
    // 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it.
    atomicWriteSync(path, `${JSON.stringify(slot)}\n`, { mode: 0o640 });
    remember(path, slot);
  }
  await fsyncDir(paths.slots);
  return result;
}

/** `unbind` of the last binding of an instance: fetch stops renewing it. */
export function retireSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  const path = join(paths.slots, slotFileName(slot));
  knownGood.delete(path);
  return deleteFile(path);
}
