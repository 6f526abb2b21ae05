import { join } from 'node:path';
import { unlink } from 'node:fs/promises';
import { writeSlotFile } from './inbox.js';
import { emptySlotFile, readSlotFile, slotFileName, type HandoffPaths } from '../data/handoff.js';

/** `bind`: make the slot known to fetch (no token yet → renewed at once). Idempotent. */
export async function ensureSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  const existing = await readSlotFile(paths, slot);
  if (existing && !existing.revoked) return false;
  await writeSlotFile(paths, existing ? { ...existing, revoked: undefined } : emptySlotFile(slot));
  return true;
}

/** `unbind` of the last binding of an instance: fetch stops renewing it. */
export async function retireSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  try {
    await unlink(join(paths.slots, slotFileName(slot)));
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}
