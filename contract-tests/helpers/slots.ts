import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The slots of a hand-off as the link reads them (SPEC §4 as built, docs/design/
 * scale-handoff.md part 1): the ids in `slots/slots.manifest` (apply's reconcile writes
 * it) and the per-slot files `slots/<slot>.json` (written once a slot holds a token or is
 * revoked, or by `bind`). Read from the files, not through the code under test.
 */
export function handoffSlots(handoff: string): string[] {
  const dir = join(handoff, 'slots');
  if (!existsSync(dir)) return [];
  const ids = new Set(readdirSync(dir).filter((n) => n.endsWith('.json') && !n.startsWith('.')).map((n) => n.slice(0, -'.json'.length)));
  for (const slot of manifestSlots(handoff)) ids.add(slot);
  return [...ids].sort();
}

/** The manifest's ids (none when it is absent). */
export function manifestSlots(handoff: string): string[] {
  const path = join(handoff, 'slots', 'slots.manifest');
  if (!existsSync(path)) return [];
  return (JSON.parse(readFileSync(path, 'utf8')) as { slots: string[] }).slots;
}

export function hasSlot(handoff: string, slot: string): boolean {
  return handoffSlots(handoff).includes(slot);
}
