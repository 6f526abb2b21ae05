import { existsSync } from 'node:fs';
import { mkdir, readdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { atomicWriteSync } from '../../fs/atomic-write.js';
import { readBoundedRegularFileSync } from '../../fs/bounded-read.js';
import { parseJsonWith } from '../../data/parse.js';
import { rfc3339Schema, slotIdSchema, tokenIdSchema } from '../../data/renew-wire.js';
import { PendingJournal, pendingRenewalSchema } from './pending-journal.js';

/** A record is a few hundred bytes; anything past this is not one (read as a fresh slot). */
const MAX_RECORD_BYTES = 16 * 1024;

/**
 * fetch's private memory (in its own StateDirectory, unreadable to anyone else), one file
 * per slot so each update is one atomic rename, plus the journal that makes each pending
 * requestId durable (write()):
 * - `pending`: the renewal in progress. Written BEFORE the request is sent, so a crash or
 *   a lost answer is retried with the same requestId and the Gateway answers with the
 *   token it already minted instead of minting a second one.
 * - `delivered`: the last token handed to apply (no secret: id and times only), so fetch
 *   does not renew again while apply has not caught up.
 * - `adopted`: the Gateway's current tokenId learned from a 409, the next expectation.
 */
export const renewalSlotStateSchema = z.strictObject({
  slot: slotIdSchema,
  pending: pendingRenewalSchema.optional(),
  delivered: z
    .strictObject({ tokenId: tokenIdSchema, expiresAt: rfc3339Schema, generation: z.number().int().min(0), receivedAt: rfc3339Schema })
    .optional(),
  adopted: tokenIdSchema.nullable().optional(),
});

export type RenewalSlotState = z.infer<typeof renewalSlotStateSchema>;

export class RenewalState {
  /**
   * fetch is the only writer of these files and one process runs: what it wrote or read
   * once is kept, so a scan of 10 000 slots reads none of them again.
   */
  private readonly cache = new Map<string, RenewalSlotState>();
  /** Where each pending requestId is made durable, many at a time (pending-journal.ts). */
  private readonly journal: PendingJournal;

  constructor(readonly dir: string) {
    this.journal = new PendingJournal(dir);
  }

  private path(slot: string): string {
    return join(this.dir, `${slot}.json`);
  }

  async init(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  /** A missing or unreadable record starts afresh: worst case one extra renewal, never a wrong token. */
  async read(slot: string): Promise<RenewalSlotState> {
    return this.readSync(slot);
  }

  /** `read` without the await: a scan of 10 000 slots is then one pass, not 10 000 hops. */
  readSync(slot: string): RenewalSlotState {
    return this.readNow(slot) ?? this.remember({ slot });
  }

  private readNow(slot: string): RenewalSlotState | undefined {
    const cached = this.cache.get(slot);
    if (cached) return cached;
    let text: string;
    try {
      // A few hundred bytes (SYNC_READ_MAX_BYTES): read in synchronous calls.
      text = readBoundedRegularFileSync(this.path(slot), MAX_RECORD_BYTES).text;
    } catch {
      return undefined;
    }
    const parsed = parseJsonWith(renewalSlotStateSchema, text);
    return this.remember(parsed.ok && parsed.value.slot === slot ? parsed.value : { slot });
  }

  private remember(state: RenewalSlotState): RenewalSlotState {
    this.cache.set(state.slot, state);
    return state;
  }

  /**
   * At start: a pending requestId the journal holds but the slot's record lost (a power cut
   * within the writeback delay) is put back, so the retry reuses it. A record that shows the
   * renewal settled since (delivered after it, a 409 adopted) or a slot forgotten (no
   * record) keeps what it says. Returns the slots whose pending was put back.
   */
  recover(): string[] {
    const restored: string[] = [];
    this.journal.recover((entry) => {
      const record = this.readNow(entry.slot);
      if (!record || !existsSync(this.path(entry.slot))) return false;
      if (record.pending?.requestId === entry.requestId) return true;
      const settledSince =
        (record.pending !== undefined && record.pending.since >= entry.since) ||
        record.adopted !== undefined ||
        (record.delivered !== undefined && record.delivered.receivedAt >= entry.since);
      if (settledSince) return false;
      const { slot, ...pending } = entry;
      this.writeRecord({ ...record, pending });
      restored.push(slot);
      return true;
    });
    return restored;
  }

  /** The slot was retired: its record goes with it. */
  async forget(slot: string): Promise<void> {
    this.cache.delete(slot);
    this.journal.settle(slot);
    await unlink(this.path(slot)).catch(() => undefined);
  }

  /** The slots with a record on disk. */
  async recorded(): Promise<string[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    return names.flatMap((n) => (n.endsWith('.json') && !n.startsWith('.') && slotIdSchema.safeParse(n.slice(0, -5)).success ? [n.slice(0, -5)] : []));
  }

  /**
   * Each record is written whole or absent (temp + rename) but without an fsync: what must
   * survive a power cut is a pending requestId, and that is made durable in the journal
   * (one fsync for every renewal that started meanwhile) before this returns. Whatever
   * else a power cut loses is harmless: a lost delivered record leaves the pending
   * requestId, whose retry is answered with the token already minted (apply ignores a
   * replay); a lost 409 or 404 settlement is asked again and answered the same.
   */
  async write(state: RenewalSlotState): Promise<void> {
    const before = this.cache.get(state.slot);
    this.writeRecord(state);
    if (!state.pending) this.journal.settle(state.slot);
    else if (before?.pending?.requestId !== state.pending.requestId) {
      try {
        await this.journal.commit({ slot: state.slot, ...state.pending });
      } catch (err) {
        // Not durable: this requestId must never be sent (the next attempt starts another),
        // so the record goes back to what it was, in memory at least.
        const previous = before ?? { slot: state.slot };
        try {
          this.writeRecord(previous);
        } catch {
          this.cache.set(state.slot, previous);
        }
        throw err;
      }
    }
  }

  private writeRecord(state: RenewalSlotState): void {
    atomicWriteSync(this.path(state.slot), `${JSON.stringify(state)}\n`, { mode: 0o600 });
    this.cache.set(state.slot, state);
  }
}
