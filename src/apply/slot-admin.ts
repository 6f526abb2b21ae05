import { join } from 'node:path';
import { emptySlotFile, readSlotFile, slotFileName, type HandoffPaths, type SlotFile } from '../data/handoff.js';
import { atomicWrite } from '../fs/atomic-write.js';
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

/** `unbind` of the last binding of an instance: fetch stops renewing it. */
export function retireSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  return deleteFile(join(paths.slots, slotFileName(slot)));
}
