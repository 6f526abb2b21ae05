import { readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { atomicWrite } from '../../fs/atomic-write.js';
import { readBoundedRegularFileSync } from '../../fs/bounded-read.js';
import { rfc3339Schema, slotIdSchema, tokenIdSchema } from '../../data/renew-wire.js';

/** A renewal in progress: its requestId, kept across every retry until it settles. */
export const pendingRenewalSchema = z.strictObject({ requestId: z.uuid(), expectedTokenId: tokenIdSchema.nullable(), since: rfc3339Schema });

export const journalEntrySchema = pendingRenewalSchema.extend({ slot: slotIdSchema });

export type JournalEntry = z.infer<typeof journalEntrySchema>;

/** `pending-<seq>.journal`: not `<slot>.json`, so nothing that lists the slot records takes it for one. */
const BATCH_NAME = /^pending-(\d{1,15})\.journal$/;
/**
 * Batches written at once. One at a time, a renewal waited on average one and a half batch
 * writes (two fsyncs each) before it was sent, and with the pool's 32 places that wait set
 * the pace (~100 slots/s at load 18, ~140 with one file per slot): a few in flight keep the
 * wait at one write while a burst still shares each fsync among many renewals.
 */
export const JOURNAL_BATCHES_IN_FLIGHT = 4;

/** A batch holds at most one entry per slot in flight: far below this. */
const MAX_BATCH_BYTES = 16 * 1024 * 1024;

/**
 * The durable half of "the pending requestId is on disk before the request is sent", for
 * many slots at once. Each slot's record is written without an fsync (renewal-state.ts);
 * its pending requestId is made durable here, in a batch file fsynced once for every
 * renewal that started meanwhile (group commit: a caller arriving while a batch is written
 * joins the next one, which starts after its call; up to JOURNAL_BATCHES_IN_FLIGHT at once). One fsynced file per renewal capped a
 * host at the disk's fsync rate and cost most of the link's CPU per slot.
 *
 * A batch is deleted once none of its entries is still the pending renewal of its slot
 * (settled, superseded or forgotten). A record lost to a power cut is found again here at
 * the next start (`recover`), so its retry reuses the same requestId.
 */
export class PendingJournal {
  #seq = 0;
  /** Entries waiting for the next batch, and the promise that batch's write settles. */
  #queued: JournalEntry[] = [];
  #next: { promise: Promise<void>; resolve: () => void; reject: (err: unknown) => void } | undefined;
  /** The batches being written. */
  readonly #inWrite = new Set<string>();
  /** batch name → the slots whose current pending is in it. */
  readonly #outstanding = new Map<string, Set<string>>();
  /** slot → the batch holding its current pending requestId. */
  readonly #batchOf = new Map<string, string>();

  constructor(readonly dir: string) {}

  /**
   * The entries of the batches a previous run left, newest last (later batches win), and
   * from now on those batches count as written: each is kept while one of its entries is
   * still a slot's pending renewal (`keep`), else deleted.
   */
  recover(keep: (entry: JournalEntry) => boolean): JournalEntry[] {
    const batches = readdirSync(this.dir)
      .flatMap((name) => {
        const m = BATCH_NAME.exec(name);
        return m ? [{ name, seq: Number(m[1]) }] : [];
      })
      .sort((a, b) => a.seq - b.seq);
    const latest = new Map<string, JournalEntry>();
    for (const { name, seq } of batches) {
      this.#seq = Math.max(this.#seq, seq);
      let text = '';
      try {
        text = readBoundedRegularFileSync(join(this.dir, name), MAX_BATCH_BYTES).text;
      } catch {
        // Unreadable: its entries are lost (worst case one extra renewal), never a wrong token.
      }
      const slots = new Set<string>();
      for (const line of text.split('\n')) {
        if (line === '') continue;
        let value: unknown;
        try {
          value = JSON.parse(line);
        } catch {
          continue;
        }
        const parsed = journalEntrySchema.safeParse(value);
        if (!parsed.success) continue;
        latest.set(parsed.data.slot, parsed.data);
        slots.add(parsed.data.slot);
      }
      this.#outstanding.set(name, slots);
    }
    const entries = [...latest.values()];
    for (const entry of entries) {
      const batch = batches.findLast((b) => this.#outstanding.get(b.name)?.has(entry.slot))?.name;
      if (batch !== undefined && keep(entry)) this.#batchOf.set(entry.slot, batch);
    }
    for (const [name, slots] of this.#outstanding) {
      for (const slot of slots) if (this.#batchOf.get(slot) !== name) slots.delete(slot);
      this.#dropIfSettled(name);
    }
    return entries;
  }

  /** Resolves once `entry` is durable; the slot's earlier entry, if any, is settled by it. */
  async commit(entry: JournalEntry): Promise<void> {
    this.settle(entry.slot);
    this.#queued.push(entry);
    if (!this.#next) {
      let resolve: () => void = () => undefined;
      let reject: (err: unknown) => void = () => undefined;
      const promise = new Promise<void>((res, rej) => {
        resolve = res;
        reject = rej;
      });
      this.#next = { promise, resolve, reject };
    }
    const joined = this.#next.promise;
    // #pump may take the queue at once (synchronously), hence `joined` taken before.
    this.#pump();
    return joined;
  }

  /** The slot's pending renewal settled (or the slot is gone): its batch may go. */
  settle(slot: string): void {
    const batch = this.#batchOf.get(slot);
    if (batch === undefined) return;
    this.#batchOf.delete(slot);
    this.#outstanding.get(batch)?.delete(slot);
    this.#dropIfSettled(batch);
  }

  /** Starts a batch of what is queued while fewer than JOURNAL_BATCHES_IN_FLIGHT are being written. */
  #pump(): void {
    while (this.#next && this.#inWrite.size < JOURNAL_BATCHES_IN_FLIGHT) {
      const waiter = this.#next;
      const entries = this.#queued;
      this.#next = undefined;
      this.#queued = [];
      void this.#write(`pending-${++this.#seq}.journal`, entries, waiter);
    }
  }

  async #write(name: string, entries: JournalEntry[], waiter: { resolve: () => void; reject: (err: unknown) => void }): Promise<void> {
    const slots = new Set(entries.map((e) => e.slot));
    // Counted before the write: a slot settled while it runs must not be tracked after it.
    this.#outstanding.set(name, slots);
    for (const slot of slots) this.#batchOf.set(slot, name);
    this.#inWrite.add(name);
    try {
      await atomicWrite(join(this.dir, name), entries.map((e) => `${JSON.stringify(e)}\n`).join(''), { mode: 0o600 });
      waiter.resolve();
    } catch (err) {
      for (const slot of slots) if (this.#batchOf.get(slot) === name) this.#batchOf.delete(slot);
      this.#outstanding.delete(name);
      waiter.reject(err);
    } finally {
      this.#inWrite.delete(name);
    }
    this.#dropIfSettled(name);
    this.#pump();
  }

  #dropIfSettled(name: string): void {
    const slots = this.#outstanding.get(name);
    if (!slots || slots.size > 0) return;
    // A batch still being written is dropped when its write ends (#drain asks again).
    if (this.#inWrite.has(name)) return;
    this.#outstanding.delete(name);
    try {
      unlinkSync(join(this.dir, name));
    } catch {
      // Already gone (a failed write leaves nothing).
    }
  }
}
