import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { atomicWrite } from '../../fs/atomic-write.js';
import {
  batchFileName,
  INBOX_BATCH_VERSION,
  MAX_BATCH_ENTRIES,
  MAX_BATCH_WRITE_BYTES,
  type InboxFile,
} from '../../data/handoff.js';

interface Waiting {
  text: string;
  resolve: () => void;
  reject: (err: unknown) => void;
}

export interface InboxBatcherOptions {
  /** The hand-off's inbox/ (made again if a write finds it gone). */
  dir: string;
  /** Test hook: called in the middle of each batch file's write (a crash test kills there). */
  midWrite?: () => void;
  now?: () => number;
}

/**
 * Group commit of the hand-off to apply (docs/design/scale-handoff.md, part 2). Each answer
 * the link must hand over is given to `deliver`, which resolves once a batch file holding it
 * is durable in inbox/ (atomicWrite: temp, fsync, rename, directory fsync). One file per
 * answer cost each side five file system round trips and an fsync per slot; now it is one
 * file per group.
 *
 * No timer forms the group: the first answer is written at once, alone; answers arriving
 * while a write is in flight (the other renewals of the pool, 32 by default) wait and go
 * together into the next file, up to `MAX_BATCH_ENTRIES` and `MAX_BATCH_WRITE_BYTES`. A
 * quiet host thus hands each answer over as soon as it did one file per slot, and a busy
 * one pays one fsync per fsync's worth of answers.
 *
 * A failed write rejects every answer of its file: each renewal retries with its same
 * requestId (nothing is recorded delivered before `deliver` resolved), exactly as when its
 * own file failed.
 *
 * File names: `batch-<sequence>-<random>.json`, the sequence the wall clock in microseconds,
 * forced increasing within the process. apply takes batches in name order, so a restarted
 * link's files sort after those of the run before it (the clock moved on) without a counter
 * kept on disk; a clock stepped back across a restart only reorders files whose entries
 * `isNewer` judges anyway (order is an optimisation, never what decides which token wins).
 * The random part makes a name unguessable and unique across two links writing at once.
 */
export class InboxBatcher {
  readonly #dir: string;
  readonly #midWrite: (() => void) | undefined;
  readonly #now: () => number;
  #queue: Waiting[] = [];
  #writing = false;
  #lastSequence = 0;

  constructor(options: InboxBatcherOptions) {
    this.#dir = options.dir;
    this.#midWrite = options.midWrite;
    this.#now = options.now ?? Date.now;
  }

  /** Resolves once `entry` is in a durable batch file; rejects if that file's write failed. */
  deliver(entry: InboxFile): Promise<void> {
    const text = JSON.stringify(entry);
    return new Promise<void>((resolve, reject) => {
      this.#queue.push({ text, resolve, reject });
      if (!this.#writing) void this.#drain();
    });
  }

  async #drain(): Promise<void> {
    this.#writing = true;
    try {
      while (this.#queue.length > 0) {
        const group = this.#take();
        try {
          await this.#write(group);
        } catch (err) {
          for (const w of group) w.reject(err);
          continue;
        }
        for (const w of group) w.resolve();
      }
    } finally {
      this.#writing = false;
    }
  }

  /** The next file's entries: at least one, then as many as the bounds allow, in arrival order. */
  #take(): Waiting[] {
    let bytes = 0;
    let n = 0;
    while (n < this.#queue.length && n < MAX_BATCH_ENTRIES) {
      const size = (this.#queue[n] as Waiting).text.length + 1;
      if (n > 0 && bytes + size > MAX_BATCH_WRITE_BYTES) break;
      bytes += size;
      n += 1;
    }
    return this.#queue.splice(0, n);
  }

  async #write(group: readonly Waiting[]): Promise<void> {
    // The entries are already JSON (validated answers serialised once): joined, not re-parsed.
    const text = `{"v":${INBOX_BATCH_VERSION},"entries":[\n${group.map((w) => w.text).join(',\n')}\n]}\n`;
    this.#lastSequence = Math.max(this.#lastSequence + 1, Math.floor(this.#now() * 1000));
    const path = join(this.#dir, batchFileName(this.#lastSequence, randomBytes(6).toString('hex')));
    const options = { mode: 0o640, ...(this.#midWrite && { midWrite: this.#midWrite }) };
    try {
      await atomicWrite(path, text, options);
    } catch (err) {
      // The inbox exists (the service checked it at start): made again only when a write
      // finds it gone, not with a mkdir before every batch.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      await mkdir(this.#dir, { recursive: true });
      await atomicWrite(path, text, options);
    }
  }
}
