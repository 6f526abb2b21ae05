import { join } from 'node:path';
import { emptySlotFile, readSlotFile, slotFileName, type HandoffPaths, type SlotFile } from '../data/handoff.js';
import { atomicWrite, atomicWriteSync, fsyncDir } from '../fs/atomic-write.js';
import { deleteFile } from '../fs/delete-file.js';
import { ensureHandoffDir } from './handoff-dirs.js';

export async function writeSlotFile(paths: HandoffPaths, slot: SlotFile): Promise<void> {
  // Never through a symlink the link planted in place of slots/.
  await ensureHandoffDir(paths, 'slots');
  // 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it.
  await atomicWrite(join(paths.slots, slotFileName(slot.slot)), `${JSON.stringify(slot)}\n`, { mode: 0o640 });
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

/**
 * `ensureSlot` for every slot of a desired state at once: each missing, unreadable or
 * revoked (unless `revive: false`) slot file is (re)written; `present` are the names listed in slots/ (a file not
 * there needs no read). The new files are written whole-or-absent (temp + rename) without
 * an fsync each: 10 000 of them, two fsyncs apiece, took 10–50 s on a shared disk where the
 * goal is a state in force within 2 s. One fsync of slots/ makes the renames durable; a
 * file whose content a power loss lost is re-made by the next reconcile (apply runs one at
 * every start: `reconcileDesiredState`), before anything could need it. Returns the slots written.
 */
export async function ensureSlots(paths: HandoffPaths, slots: readonly string[], present: ReadonlySet<string>, options: { revive?: boolean } = {}): Promise<string[]> {
  const write: SlotFile[] = [];
  await eachInParallel(
    slots.filter((s) => present.has(s)),
    async (slot) => {
      const existing = await readSlotFile(paths, slot).catch(() => undefined);
      if (!existing) write.push(emptySlotFile(slot));
      else if (existing.revoked && options.revive !== false) write.push({ ...existing, revoked: undefined });
    },
  );
  for (const slot of slots) if (!present.has(slot)) write.push(emptySlotFile(slot));
  if (write.length === 0) return [];
  // Never through a symlink the link planted in place of slots/.
  await ensureHandoffDir(paths, 'slots');
  for (let i = 0; i < write.length; i++) {
    if (i > 0 && i % SYNC_BATCH === 0) await new Promise((resolve) => setImmediate(resolve));
    const slot = write[i]!;
    // 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it.
    atomicWriteSync(join(paths.slots, slotFileName(slot.slot)), `${JSON.stringify(slot)}\n`, { mode: 0o640 });
  }
  await fsyncDir(paths.slots);
  return write.map((s) => s.slot);
}

/** `unbind` of the last binding of an instance: fetch stops renewing it. */
export function retireSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  return deleteFile(join(paths.slots, slotFileName(slot)));
}
