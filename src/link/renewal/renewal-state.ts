import { readdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { hookEnabled } from '../../service/test-hooks.js';
import { Ledger } from './ledger.js';
import { isLegacyName, readLegacyRecords, removeLegacyFiles } from './legacy-records.js';
import { forgottenSchema, renewalSlotStateSchema, type RenewalSlotState } from './record-schema.js';

export { pendingRenewalSchema, renewalSlotStateSchema, type RenewalSlotState } from './record-schema.js';

/** What the start found in the record directory, for the log. */
export interface RenewalStateRecovery {
  /** Records read from the ledger (or folded into it). */
  records: number;
  /** Ledger lines skipped as unreadable: those slots keep their earlier state (worst case one extra renewal). */
  skipped: number;
  /** A torn last line (a crash mid-append) was cut off. */
  torn: boolean;
  /** Per-slot record files and journal batches of a link before the ledger, folded in and removed. */
  upgradedFiles: number;
  /** Of those, slots whose pending requestId only the old journal still held (put back). */
  restored: string[];
}

/**
 * The link's private memory of each slot (record-schema.ts), kept in one append-only ledger
 * in its StateDirectory (ledger.ts): `<dir>/ledger-<n>.log` and `<dir>/ledger.snapshot`,
 * 0600. Until session 11 it was a file per slot plus journal batches; a link that finds
 * those folds them in at start (durably), then removes them.
 */
export class RenewalState {
  readonly #ledger: Ledger<RenewalSlotState>;

  constructor(
    readonly dir: string,
    options: { onCompactError?: (err: unknown) => void } = {},
  ) {
    // Test hook: compaction after almost every group, so a crash test meets one at once.
    const small = hookEnabled('ledger-compact-early');
    this.#ledger = new Ledger(dir, renewalSlotStateSchema, forgottenSchema, {
      ...(options.onCompactError && { onCompactError: options.onCompactError }),
      ...(small && { compactFloorBytes: 0, compactFactor: 1 }),
    });
  }

  async init(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  /**
   * Reads the ledger (and folds in what a link before it left). Called at start; every
   * other method opens it on first use too.
   */
  recover(): RenewalStateRecovery {
    if (this.#ledger.opened) return { records: this.#ledger.slots().length, skipped: 0, torn: false, upgradedFiles: 0, restored: [] };
    const legacyNames = readdirSync(this.dir).filter(isLegacyName);
    const legacy = legacyNames.length > 0 ? readLegacyRecords(this.dir) : undefined;
    const opened = this.#ledger.open(legacy?.records);
    // Removed only once their content is durable in the ledger (open's snapshot is fsynced).
    // Found beside a ledger, they are what an upgrade interrupted before removing them left:
    // the ledger already holds them, and may hold newer state, so they are not read again.
    if (legacy) removeLegacyFiles(this.dir, legacy.files);
    return {
      records: this.#ledger.slots().length,
      skipped: opened.skipped,
      torn: opened.torn,
      upgradedFiles: opened.started ? legacyNames.length : 0,
      restored: opened.started ? (legacy?.restored ?? []) : [],
    };
  }

  #open(): Ledger<RenewalSlotState> {
    if (!this.#ledger.opened) this.recover();
    return this.#ledger;
  }

  /** A slot without a record starts afresh: worst case one extra renewal, never a wrong token. */
  async read(slot: string): Promise<RenewalSlotState> {
    return this.readSync(slot);
  }

  /** `read` without the await: a scan of 10 000 slots is then one pass, not 10 000 hops. */
  readSync(slot: string): RenewalSlotState {
    return this.#open().get(slot) ?? { slot };
  }

  /** The slot was retired: its record goes with it. */
  async forget(slot: string): Promise<void> {
    await this.#open().delete(slot);
  }

  /** The slots with a record. */
  async recorded(): Promise<string[]> {
    return this.#open().slots();
  }

  /**
   * What must survive a power cut is a pending requestId, before its request is sent: a
   * new one resolves only once its line is fdatasynced (one sync for every renewal that
   * started meanwhile). Every other change resolves once its line is written (whole to a
   * restarted process, not across a power cut) and rides in the same groups. Whatever a
   * power cut loses of those is harmless: a lost delivered record leaves the pending
   * requestId, whose retry is answered with the token already minted (apply ignores a
   * replay); a lost 409 or 404 settlement is asked again and answered the same; a lost
   * `forgotten` line brings back a retired slot's record, which the start prunes again (its
   * slot file is gone).
   */
  async write(state: RenewalSlotState): Promise<void> {
    const ledger = this.#open();
    const before = ledger.get(state.slot);
    const durable = state.pending !== undefined && before?.pending?.requestId !== state.pending.requestId;
    try {
      await ledger.set(state, durable);
    } catch (err) {
      if (durable) {
        // Not durable: this requestId must never be sent (the next attempt starts another),
        // so the record goes back to what it was (a line saying so follows, if it can).
        const revert = before ? ledger.set(before, false) : ledger.delete(state.slot);
        revert.catch(() => undefined);
      }
      throw err;
    }
  }

  /** Resolves when no compaction is running (tests). */
  settled(): Promise<void> {
    return this.#ledger.settled();
  }

  /** The records on disk, read without opening the ledger for writing (status, tests). */
  static readRecords(dir: string): Map<string, RenewalSlotState> {
    return Ledger.read(dir, renewalSlotStateSchema, forgottenSchema);
  }
}
