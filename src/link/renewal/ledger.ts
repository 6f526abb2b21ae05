import { closeSync, constants, fdatasync, fstatSync, fsyncSync, ftruncateSync, lstatSync, openSync, readSync, readdirSync, renameSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { z } from 'zod';
import { atomicWrite, closeQuietly, fsyncDir, tempPathFor, unlinkQuietly } from '../../fs/atomic-write.js';
import { crashPoint, hookEnabled } from '../../service/test-hooks.js';

/**
 * The link's renewal records as one append-only log instead of a file per slot (session 12).
 * Each record change is one JSON line appended to `ledger-<n>.log`; every change made while
 * the previous group was written goes out in one write(2) (group commit). A change that must
 * be durable (a pending requestId, before its request is sent) resolves only after an
 * fdatasync that started after its line was written; the others ride along in the same
 * groups and resolve once written (whole to every reader and across a crash of the
 * process, not across a power cut: renewal-state.ts says why that is harmless).
 *
 * Compaction: once the log is past COMPACT_FACTOR × the live records' lines (and at least
 * COMPACT_FLOOR_BYTES), appends move to `ledger-<n+1>.log` at once, and the live records
 * are written as `ledger.snapshot` (atomicWrite: temp, fsync, rename, directory fsync)
 * whose first line names n+1; then the older logs go. Recovery reads the snapshot and
 * every log numbered from the one it names, in order, so whatever point a crash hit, the
 * lines after the snapshot's state are read: a crash before the rename leaves the previous
 * snapshot, which names the previous log, still there, followed by the new one.
 *
 * Read at start in bounded chunks, line by line (a line past MAX_LINE_BYTES is skipped): a
 * torn last line (a crash mid-append) is ignored and cut off before appending; a corrupt
 * line anywhere is skipped and counted. The memory is the live map, never the log text.
 */

export const SNAPSHOT_NAME = 'ledger.snapshot';
const LOG_NAME = /^ledger-(\d{1,15})\.log$/;
export const logName = (n: number): string => `ledger-${n}.log`;
/** A record is a few hundred bytes; a line past this is not one of ours (skipped, never appended). */
export const MAX_LINE_BYTES = 4 * 1024;
const READ_CHUNK_BYTES = 1024 * 1024;
export const COMPACT_FLOOR_BYTES = 1024 * 1024;
export const COMPACT_FACTOR = 4;
/**
 * fdatasyncs in flight at once. One at a time, a renewal arriving during a sync waited for
 * it and then its own (a batch and a half on average; with the pool's 32 places that wait
 * set the pace, session 9's journal): a few in flight keep the wait at about one.
 */
export const SYNCS_IN_FLIGHT = 4;

const fdatasyncFd = promisify(fdatasync);
/** Test hook (crash tests only): each group is written in two halves with the crash point between them. */
const CRASH_MID_APPEND = hookEnabled('crash:link-ledger-mid-append');

interface Waiter {
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** What a ledger line holds: a record (keyed by its slot), or the slot's record removed. */
export interface Keyed {
  slot: string;
}

export interface LedgerOpenResult {
  /** Lines that could not be read as a record (skipped: that slot's earlier state stands). */
  skipped: number;
  /** A torn last line was found (a crash mid-append) and cut off. */
  torn: boolean;
  /** There was no ledger: `initial` became its first snapshot. */
  started: boolean;
}

export interface LedgerOptions {
  compactFloorBytes?: number;
  compactFactor?: number;
  /** A compaction failed (the log goes on; the next attempt waits for another floor of growth). */
  onCompactError?: (err: unknown) => void;
}

export class Ledger<T extends Keyed> {
  readonly #records = new Map<string, T>();
  /** The byte length of each live record's line: the snapshot's size, for the compaction bound. */
  readonly #lineBytes = new Map<string, number>();
  #liveBytes = 0;
  #fd = -1;
  #gen = 0;
  #size = 0;
  #opened = false;
  /** A write failed and could not be cut back: the next group starts on a fresh line. */
  #dirty = false;
  /** The current log's directory entry is durable once this settles (a new log's dir fsync). */
  #logReady: Promise<void> = Promise.resolve();
  #queued: string[] = [];
  #queuedWritten: Waiter[] = [];
  #queuedDurable: Waiter[] = [];
  #flushScheduled = false;
  /** Written, waiting for an fdatasync to start (with the log they were written to). */
  #syncWaiting: Array<{ fd: number; ready: Promise<void>; waiters: Waiter[] }> = [];
  #syncsInFlight = 0;
  /** fd → syncs not yet settled on it: an old log's fd is closed once none is left. */
  readonly #fdUsers = new Map<number, number>();
  readonly #retiredFds = new Set<number>();
  #compacting: Promise<void> | undefined;
  #compactAfter = 0;
  #groups = 0;
  readonly #floor: number;
  readonly #factor: number;

  constructor(
    readonly dir: string,
    private readonly schema: z.ZodType<T>,
    private readonly forgetSchema: z.ZodType<{ slot: string; forgotten: true }>,
    private readonly options: LedgerOptions = {},
  ) {
    this.#floor = options.compactFloorBytes ?? COMPACT_FLOOR_BYTES;
    this.#factor = options.compactFactor ?? COMPACT_FACTOR;
  }

  get opened(): boolean {
    return this.#opened;
  }

  /**
   * Reads the snapshot and the logs after it, then opens the newest log for appending
   * (created when there is none). `initial`: records to start from when there is no
   * ledger at all (the upgrade from per-slot files); they are made durable as the first
   * snapshot before this returns.
   */
  open(initial?: Iterable<T>): LedgerOpenResult {
    if (this.#opened) return { skipped: 0, torn: false, started: false };
    const load = this.#load();
    let { from } = load;
    const started = load.logs.length === 0 && !load.snapshot;
    if (started && initial !== undefined) {
      for (const record of initial) this.#remember(record, `${JSON.stringify(record)}\n`);
      if (this.#records.size > 0) writeDurableSync(join(this.dir, SNAPSHOT_NAME), this.#snapshotText(1));
      from = 1;
    }
    // Superseded by the snapshot (a compaction ended before it removed them).
    for (const n of load.logs) if (n < from) unlinkQuietly(join(this.dir, logName(n)));
    const current = load.logs.filter((n) => n >= from);
    this.#gen = current[current.length - 1] ?? from;
    if (current.length === 0) this.#createLog(this.#gen);
    else {
      this.#fd = openSync(join(this.dir, logName(this.#gen)), constants.O_WRONLY | constants.O_APPEND | constants.O_NOFOLLOW);
      // A torn last line is cut off, so the next line does not run on from it.
      if (load.torn) ftruncateSync(this.#fd, load.tail);
      this.#size = load.tail;
    }
    this.#opened = true;
    return { skipped: load.skipped, torn: load.torn, started };
  }

  /** The records on disk, read without opening the ledger for writing (status, tests). */
  static read<T extends Keyed>(dir: string, schema: z.ZodType<T>, forgetSchema: z.ZodType<{ slot: string; forgotten: true }>): Map<string, T> {
    const ledger = new Ledger(dir, schema, forgetSchema);
    ledger.#load();
    return ledger.#records;
  }

  #load(): { from: number; logs: number[]; snapshot: boolean; skipped: number; torn: boolean; tail: number } {
    const names = readdirSync(this.dir);
    const logs = names
      .flatMap((n) => {
        const m = LOG_NAME.exec(n);
        return m ? [Number(m[1])] : [];
      })
      .sort((a, b) => a - b);
    let skipped = 0;
    let from = logs[0] ?? 1;
    const snapshot = names.includes(SNAPSHOT_NAME);
    if (snapshot) {
      let header = true;
      // Unreadable (not a regular file, say): its records are lost, as an unreadable record
      // file's were (worst case one extra renewal each); the logs are still read.
      const snap = tryReadLines(join(this.dir, SNAPSHOT_NAME), (line) => {
        if (header) {
          header = false;
          const h = parseHeader(line);
          if (h !== undefined) {
            from = h;
            return;
          }
          // No header: not a snapshot we wrote; its lines may still be records.
          skipped++;
        }
        if (!this.#apply(line)) skipped++;
      });
      skipped += snap.skipped;
    }
    let torn = false;
    let tail = 0;
    const last = logs[logs.length - 1];
    for (const n of logs) {
      if (n < from) continue;
      const read = readLines(join(this.dir, logName(n)), (line) => {
        if (!this.#apply(line)) skipped++;
      });
      skipped += read.skipped;
      if (n === last) {
        torn = read.torn;
        tail = read.whole;
      }
    }
    return { from, logs, snapshot, skipped, torn, tail };
  }

  get(slot: string): T | undefined {
    return this.#records.get(slot);
  }

  slots(): string[] {
    return [...this.#records.keys()];
  }

  /**
   * The record, in memory at once; on disk once the promise resolves (after an fdatasync
   * when `durable`). A line that cannot be written whole is refused before anything changes.
   */
  set(record: T, durable: boolean): Promise<void> {
    const line = `${JSON.stringify(record)}\n`;
    if (Buffer.byteLength(line) > MAX_LINE_BYTES) return Promise.reject(new Error(`a ledger record for ${record.slot} is larger than ${MAX_LINE_BYTES} bytes`));
    this.#remember(record, line);
    return this.#append(line, durable);
  }

  /** The slot's record is gone (retired): a line says so, so a restart does not bring it back. */
  delete(slot: string): Promise<void> {
    if (!this.#records.has(slot)) return Promise.resolve();
    this.#forget(slot);
    return this.#append(`${JSON.stringify({ slot, forgotten: true })}\n`, false);
  }

  /** Resolves when no compaction runs (tests, shutdown). */
  async settled(): Promise<void> {
    while (this.#compacting) await this.#compacting;
  }

  #remember(record: T, line: string): void {
    this.#forget(record.slot);
    this.#records.set(record.slot, record);
    const bytes = Buffer.byteLength(line);
    this.#lineBytes.set(record.slot, bytes);
    this.#liveBytes += bytes;
  }

  #forget(slot: string): void {
    this.#records.delete(slot);
    this.#liveBytes -= this.#lineBytes.get(slot) ?? 0;
    this.#lineBytes.delete(slot);
  }

  /** One line read back: true if it was a record or a removal. */
  #apply(line: string): boolean {
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      return false;
    }
    const record = this.schema.safeParse(value);
    if (record.success) {
      this.#remember(record.data, `${line}\n`);
      return true;
    }
    const gone = this.forgetSchema.safeParse(value);
    if (gone.success) {
      this.#forget(gone.data.slot);
      return true;
    }
    return false;
  }

  #append(line: string, durable: boolean): Promise<void> {
    if (!this.#opened) return Promise.reject(new Error('the ledger is not open'));
    return new Promise<void>((resolve, reject) => {
      this.#queued.push(line);
      (durable ? this.#queuedDurable : this.#queuedWritten).push({ resolve, reject });
      if (!this.#flushScheduled) {
        this.#flushScheduled = true;
        // Every change made in this turn of the event loop (and the I/O callbacks of the
        // same phase) goes out in this one write.
        setImmediate(() => this.#flush());
      }
    });
  }

  #flush(): void {
    this.#flushScheduled = false;
    const lines = this.#queued;
    const written = this.#queuedWritten;
    const durable = this.#queuedDurable;
    this.#queued = [];
    this.#queuedWritten = [];
    this.#queuedDurable = [];
    if (lines.length === 0) return;
    const bytes = Buffer.from(`${this.#dirty ? '\n' : ''}${lines.join('')}`);
    const fd = this.#fd;
    try {
      // The crash test's mid-append: every group after the first (the first holds the
      // pending requestIds; the test needs some sent before the crash) is cut in half.
      if (CRASH_MID_APPEND && ++this.#groups > 1 && bytes.length > 1) {
        const half = Math.floor(bytes.length / 2);
        writeAll(fd, bytes.subarray(0, half));
        crashPoint('link-ledger-mid-append');
        writeAll(fd, bytes.subarray(half));
      } else writeAll(fd, bytes);
      this.#size += bytes.length;
      this.#dirty = false;
    } catch (err) {
      // Whatever part was written is cut off again; if even that fails, the next group
      // starts with a newline so the torn part is one corrupt line, not the next line's start.
      try {
        ftruncateSync(fd, this.#size);
      } catch {
        this.#dirty = true;
      }
      for (const w of [...written, ...durable]) w.reject(err);
      return;
    }
    for (const w of written) w.resolve();
    if (durable.length > 0) {
      this.#syncWaiting.push({ fd, ready: this.#logReady, waiters: durable });
      this.#fdUsers.set(fd, (this.#fdUsers.get(fd) ?? 0) + 1);
      this.#pumpSyncs();
    }
    this.#maybeCompact();
  }

  /** Starts an fdatasync for everything written and waiting, while fewer than SYNCS_IN_FLIGHT run. */
  #pumpSyncs(): void {
    while (this.#syncWaiting.length > 0 && this.#syncsInFlight < SYNCS_IN_FLIGHT) {
      const waiting = this.#syncWaiting;
      this.#syncWaiting = [];
      // At most two logs (a compaction switched between the writes): one sync each.
      for (const fd of new Set(waiting.map((w) => w.fd))) {
        const mine = waiting.filter((w) => w.fd === fd);
        this.#syncsInFlight++;
        void Promise.all([fdatasyncFd(fd), ...mine.map((w) => w.ready)]).then(
          () => {
            for (const w of mine) for (const x of w.waiters) x.resolve();
          },
          (err: unknown) => {
            for (const w of mine) for (const x of w.waiters) x.reject(err);
          },
        ).finally(() => {
          this.#syncsInFlight--;
          this.#release(fd, mine.length);
          this.#pumpSyncs();
        });
      }
    }
  }

  #release(fd: number, n: number): void {
    const left = (this.#fdUsers.get(fd) ?? 0) - n;
    if (left > 0) {
      this.#fdUsers.set(fd, left);
      return;
    }
    this.#fdUsers.delete(fd);
    if (this.#retiredFds.delete(fd)) closeQuietly(fd);
  }

  #createLog(n: number): void {
    this.#fd = openSync(join(this.dir, logName(n)), constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    this.#gen = n;
    this.#size = 0;
    // A line synced in a file whose name is not yet durable would be lost with the name.
    const ready = fsyncDir(this.dir);
    ready.catch(() => undefined);
    this.#logReady = ready;
  }

  #maybeCompact(): void {
    if (this.#compacting || this.#size < Math.max(this.#floor, this.#compactAfter) || this.#size <= this.#factor * this.#liveBytes) return;
    this.#compacting = this.#compact()
      .catch((err: unknown) => {
        this.#compactAfter = this.#size + this.#floor;
        this.options.onCompactError?.(err);
      })
      .finally(() => {
        this.#compacting = undefined;
      });
  }

  async #compact(): Promise<void> {
    // The snapshot is the records as of now; every line queued or appended from here on
    // goes to the next log, which recovery reads after it.
    const oldFd = this.#fd;
    const next = this.#gen + 1;
    const text = this.#snapshotText(next);
    this.#createLog(next);
    this.#compactAfter = 0;
    try {
      crashPoint('link-ledger-mid-compaction');
      await atomicWrite(join(this.dir, SNAPSHOT_NAME), text, { mode: 0o600 });
      crashPoint('link-ledger-after-snapshot');
      for (const name of readdirSync(this.dir)) {
        const m = LOG_NAME.exec(name);
        if (m && Number(m[1]) < next) unlinkQuietly(join(this.dir, name));
      }
    } finally {
      // Failed or not, nothing is appended to the old log again (a failed snapshot leaves it
      // on disk, where recovery reads it before the new one).
      if (this.#fdUsers.has(oldFd)) this.#retiredFds.add(oldFd);
      else closeQuietly(oldFd);
    }
  }

  #snapshotText(next: number): string {
    let text = `${JSON.stringify({ v: 1, log: next })}\n`;
    for (const record of this.#records.values()) text += `${JSON.stringify(record)}\n`;
    return text;
  }
}

function parseHeader(line: string): number | undefined {
  try {
    const h = JSON.parse(line) as unknown;
    if (typeof h === 'object' && h !== null && 'v' in h && h.v === 1 && 'log' in h && Number.isSafeInteger(h.log) && (h.log as number) > 0) return h.log as number;
  } catch {
    // not a header
  }
  return undefined;
}

/**
 * Reads `path` line by line in bounded chunks (never through a symlink, never a FIFO),
 * calling `onLine` for each whole line. `whole`: the bytes up to the last newline; `torn`:
 * bytes after it (a crash mid-append).
 */
export function readLines(path: string, onLine: (line: string) => void): { skipped: number; torn: boolean; whole: number } {
  const fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    if (!fstatSync(fd).isFile()) throw new Error(`${path} is not a regular file`);
    const chunk = Buffer.alloc(READ_CHUNK_BYTES);
    let carry: Buffer = Buffer.alloc(0);
    let overlong = false;
    let skipped = 0;
    let offset = 0;
    let whole = 0;
    for (;;) {
      const n = readSync(fd, chunk, 0, chunk.length, offset);
      if (n === 0) break;
      offset += n;
      let data: Buffer = carry.length > 0 ? Buffer.concat([carry, chunk.subarray(0, n)]) : chunk.subarray(0, n);
      let start = 0;
      for (let nl = data.indexOf(0x0a, start); nl !== -1; nl = data.indexOf(0x0a, start)) {
        if (overlong || nl - start > MAX_LINE_BYTES) skipped++;
        else if (nl > start) onLine(data.toString('utf8', start, nl));
        overlong = false;
        start = nl + 1;
      }
      whole = offset - (data.length - start);
      data = data.subarray(start);
      if (data.length > MAX_LINE_BYTES) {
        // Not one of ours: dropped until its end, never held whole.
        overlong = true;
        data = Buffer.alloc(0);
      }
      carry = Buffer.from(data);
    }
    return { skipped, torn: whole < offset, whole };
  } finally {
    closeSync(fd);
  }
}

function tryReadLines(path: string, onLine: (line: string) => void): { skipped: number } {
  try {
    return readLines(path, onLine);
  } catch {
    return { skipped: 1 };
  }
}

function writeAll(fd: number, bytes: Uint8Array): void {
  for (let off = 0; off < bytes.length; ) off += writeSync(fd, bytes, off);
}

/** atomicWrite's steps, synchronously: once, at the start (the upgrade's snapshot). */
function writeDurableSync(path: string, text: string): void {
  const st = lstatSync(path, { throwIfNoEntry: false });
  if (st && !st.isFile()) throw new Error(`refusing to replace non-regular file at ${path}`);
  const dir = join(path, '..');
  const tmp = tempPathFor(dir, SNAPSHOT_NAME);
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    writeAll(fd, Buffer.from(text));
    fsyncSync(fd);
  } catch (err) {
    closeQuietly(fd);
    unlinkQuietly(tmp);
    throw err;
  }
  closeSync(fd);
  renameSync(tmp, path);
  const dfd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    fsyncSync(dfd);
  } finally {
    closeSync(dfd);
  }
}
