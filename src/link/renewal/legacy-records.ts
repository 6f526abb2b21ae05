import { readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { readBoundedRegularFileSync } from '../../fs/bounded-read.js';
import { parseJsonWith } from '../../data/parse.js';
import { slotIdSchema } from '../../data/renew-wire.js';
import { pendingRenewalSchema, renewalSlotStateSchema, type RenewalSlotState } from './record-schema.js';

/** A record was a few hundred bytes; anything past this was not one (read as a fresh slot). */
const MAX_RECORD_BYTES = 16 * 1024;
/** A journal batch held at most one entry per slot in flight. */
const MAX_BATCH_BYTES = 16 * 1024 * 1024;
/** Session 9–11's journal batches: `pending-<seq>.journal`. */
const BATCH_NAME = /^pending-(\d{1,15})\.journal$/;

const journalEntrySchema = pendingRenewalSchema.extend({ slot: slotIdSchema });
type JournalEntry = z.infer<typeof journalEntrySchema>;

export interface LegacyRecords {
  /** The files a link before the ledger left (`<slot>.json`, `pending-<n>.journal`). */
  files: string[];
  records: RenewalSlotState[];
  /** Slots whose pending requestId only the journal still held (put back). */
  restored: string[];
}

/**
 * What a link before session 12 left in its record directory: one `<slot>.json` per slot
 * (written without fsync) and the journal batches that made each pending requestId durable.
 * Read as that link's own start did: a pending requestId the journal holds but the record
 * lost (a power cut within the writeback delay) is put back, unless the record shows the
 * renewal settled since (delivered after it, a 409 adopted) or the slot was forgotten (no
 * record). An unreadable record is a fresh slot: worst case one extra renewal.
 */
export function readLegacyRecords(dir: string): LegacyRecords {
  const names = readdirSync(dir);
  const files: string[] = [];
  const records = new Map<string, RenewalSlotState>();
  const batches: Array<{ name: string; seq: number }> = [];
  for (const name of names) {
    const m = BATCH_NAME.exec(name);
    if (m) {
      batches.push({ name, seq: Number(m[1]) });
      files.push(name);
      continue;
    }
    if (!name.endsWith('.json') || name.startsWith('.')) continue;
    const slot = name.slice(0, -5);
    if (!slotIdSchema.safeParse(slot).success) continue;
    files.push(name);
    let text: string;
    try {
      text = readBoundedRegularFileSync(join(dir, name), MAX_RECORD_BYTES).text;
    } catch {
      records.set(slot, { slot });
      continue;
    }
    const parsed = parseJsonWith(renewalSlotStateSchema, text);
    records.set(slot, parsed.ok && parsed.value.slot === slot ? parsed.value : { slot });
  }
  const latest = new Map<string, JournalEntry>();
  for (const { name } of batches.sort((a, b) => a.seq - b.seq)) {
    let text = '';
    try {
      text = readBoundedRegularFileSync(join(dir, name), MAX_BATCH_BYTES).text;
    } catch {
      // Unreadable: its entries are lost (worst case one extra renewal), never a wrong token.
    }
    for (const line of text.split('\n')) {
      if (line === '') continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        continue;
      }
      const entry = journalEntrySchema.safeParse(value);
      if (entry.success) latest.set(entry.data.slot, entry.data);
    }
  }
  const restored: string[] = [];
  for (const entry of latest.values()) {
    const record = records.get(entry.slot);
    if (!record || record.pending?.requestId === entry.requestId) continue;
    const settledSince =
      (record.pending !== undefined && record.pending.since >= entry.since) ||
      record.adopted !== undefined ||
      (record.delivered !== undefined && record.delivered.receivedAt >= entry.since);
    if (settledSince) continue;
    const { slot, ...pending } = entry;
    records.set(slot, { ...record, pending });
    restored.push(slot);
  }
  return { files, records: [...records.values()], restored };
}

/** Removes the legacy files once their content is durable in the ledger. */
export function removeLegacyFiles(dir: string, files: string[]): void {
  for (const name of files) {
    try {
      unlinkSync(join(dir, name));
    } catch {
      // already gone
    }
  }
}

/** Whether `name` is one of the files a link before the ledger left. */
export function isLegacyName(name: string): boolean {
  if (BATCH_NAME.test(name)) return true;
  return name.endsWith('.json') && !name.startsWith('.') && slotIdSchema.safeParse(name.slice(0, -5)).success;
}
