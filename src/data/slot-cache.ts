import { lstatSync, type Stats } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { readBoundedRegularFile, UnsafeFileError } from '../fs/bounded-read.js';
import {
  emptySlotFile,
  MAX_MANIFEST_BYTES,
  MAX_SLOT_FILE_BYTES,
  parseSlotManifest,
  SLOT_MANIFEST_FILE,
  slotEntry,
  slotFileName,
  slotManifestPath,
  slotOfFileName,
  type HandoffPaths,
  type SlotFile,
} from './handoff.js';

export interface SlotListing {
  slots: SlotFile[];
  errors: Array<{ file: string; error: string }>;
}

/**
 * A slot as last read: its file's content, an empty slot (in the manifest, no file), or why
 * its file is invalid (it still exists).
 */
export type SlotEntry = SlotFile | { slot: string; file: string; error: string };

/**
 * What changed since the previous `changes()`: the renewal's due-queue is fed from this,
 * so a wake costs the files that changed, not a walk over every slot.
 */
export interface SlotChanges {
  /** The whole directory was looked at: `updated` holds every slot there is. */
  full: boolean;
  /** Slots changed since the last call (file read, or entering the manifest), each as it now is (a slot at most once). */
  updated: SlotEntry[];
  /**
   * Slots that no longer exist: no file and not in the manifest (by name: a file
   * unreadable for a moment is still there).
   */
  removed: string[];
}

/**
 * What tells one version of a file from the next without reading it: a writer that renames
 * a new file in gives a new inode, an edit in place changes the size or the ctime (which
 * every write and chmod sets; apply's `ensureSlots` keys its own slot-file reads on the same).
 */
interface FileIdentity {
  ino: number;
  size: number;
  mtimeMs: number;
  ctimeMs: number;
}

// Times in ms as node derives them from the same seconds and nanoseconds (equal for equal
// stamps); the stat of the descriptor read (bounded-read) is not a bigint one.
const identityOf = (st: Stats): FileIdentity => ({ ino: st.ino, size: st.size, mtimeMs: st.mtimeMs, ctimeMs: st.ctimeMs });
const sameIdentity = (a: FileIdentity | undefined, b: FileIdentity): boolean =>
  a !== undefined && a.ino === b.ino && a.size === b.size && a.mtimeMs === b.mtimeMs && a.ctimeMs === b.ctimeMs;

/** A directory's mtime moves at every entry created, renamed in or out, or removed in it. */
interface DirIdentity {
  ino: number;
  mtimeMs: number;
  ctimeMs: number;
  /** When it was looked at (wall clock, as file times are). */
  at: number;
}

/**
 * A directory whose mtime is this recent when it is looked at may change again within the
 * same timestamp tick (the kernel's clock for file times is coarse, a few ms) without its
 * mtime moving: it is looked at again at the next check whatever its mtime says.
 */
const DIR_SETTLE_MS = 2_000;

/**
 * inotify's queue holds `fs.inotify.max_queued_events` events (16 384 by default): a file
 * written by rename is about four, so a reader busy while ~4 000 slot files are written
 * (apply's reconcile of a 10 000-binding state writes 11 000 in a second or two) loses the
 * rest, and node says nothing (no unnamed event; measured: 4 096 names of 11 000). A burst
 * that large shows itself by its size: after this many names since the last rescan, a
 * rescan (the identity kind: a listing and an lstat per file) runs at most every
 * BURST_RESCAN_MS, so a slot whose event was lost is found within seconds, not at the
 * next periodic check (a 10 000-slot burst once waited 60 s for 727 of them).
 */
// With the slot manifest (docs/design/scale-handoff.md, part 1) a new state is one file,
// not 11 000: the burst is now only a previous apply's, or a renewal burst's slot files.
const BURST_NAMES = 1_000;
const BURST_RESCAN_MS = 5_000;

/** lstat calls between two turns of the event loop in a rescan (10 000 in one go block it ~50-100 ms). */
const LSTAT_BATCH = 500;

export interface SlotCacheOptions {
  /**
   * The longest time between two rescans whatever the directory's mtime says: what bounds
   * an edit in place (no entry created or removed) whose file event was lost. Default: 10
   * × `fullEveryMs`.
   */
  healEveryMs?: number;
}

/**
 * The slots of a hand-off directory, kept in memory: the per-slot files, re-read only where a
 * watcher said a file changed (`changed(name)`), and the slot manifest (`slots.manifest`,
 * read once per change of it, not per slot), with a full rescan at start, on `changed()`
 * without a name, and when a periodic check finds it due (a dropped file event heals there).
 * With 10 000 slots a renewal then costs one file read, not 10 000.
 *
 * The slots are the union of the manifest's ids and the per-slot files (`readSlots`' rule):
 * a file wins over its manifest entry; an id without a file is an empty slot. A manifest
 * refused (a symlink, a FIFO, too large, invalid) counts as no ids and is reported among
 * the errors as `slots.manifest`; the files are still read.
 *
 * The periodic check (every `fullEveryMs`) costs one stat of the directory while nothing
 * in it changed: every writer in slots/ (apply) renames a new file in, and a create,
 * rename or removal moves the directory's mtime. When it moved (or was too recent to trust,
 * DIR_SETTLE_MS), the rescan lists the directory and reads only the files whose identity
 * (lstat: inode, size, mtime, ctime) differs from the one read; at least every
 * `healEveryMs` it does so even with the directory unchanged (an edit in place whose event
 * was lost). `changed()` without a name re-reads every file. A host at rest with 10 000
 * slots then costs a stat a minute here, not 10 000 reads and parses (docs/scale.md, "Idle").
 *
 * One cache serves the whole link (renewal and presence, link.ts): `current()` (the whole
 * listing) and `changes()` (what changed since the previous `changes()`: one such consumer)
 * may both be called, concurrently too; the reads are serialised, and what a `current()`
 * read is kept for the next `changes()`.
 */
export class SlotCache {
  /** The per-slot files as last read, by file name. */
  private readonly byFile = new Map<string, SlotEntry>();
  /** The identity of each file as last read (by fstat of what was read). */
  private readonly identities = new Map<string, FileIdentity>();
  /** The manifest's ids as last read (empty: absent or refused), its identity and its refusal. */
  private manifestIds = new Set<string>();
  private manifestIdentity: FileIdentity | undefined;
  private manifestError: string | undefined;
  /** The manifest was reported changed: read it at the next call. */
  private manifestPending = false;
  /** Every slot there is (the union), in the order last rescanned, then as added. */
  private readonly union = new Map<string, SlotEntry>();
  private readonly pending = new Set<string>();
  /** What changed since the last `changes()` (a `current()` in between adds to it). */
  private diffFull = false;
  private readonly diffUpdated = new Map<string, SlotEntry>();
  private readonly diffRemoved = new Set<string>();
  /** The read in progress: `current()` and `changes()` wait for each other. */
  private running: Promise<unknown> = Promise.resolve();
  /** Re-read every file at the next call (start, `changed()` without a name). */
  private full = true;
  private lastCheck = 0;
  private lastRescan = 0;
  /** The directory as it was just before the last rescan listed it; undefined: look again. */
  private dirSeen: DirIdentity | undefined;
  private readonly healEveryMs: number;
  /** Names re-read since the last rescan (BURST_NAMES). */
  private namesSinceRescan = 0;
  /** Rescans so far, files read by them, and manifest reads (what the periodic check and a new state cost; tests and bench). */
  readonly stats = { rescans: 0, rescanReads: 0, manifestReads: 0 };

  constructor(
    private readonly paths: HandoffPaths,
    private readonly fullEveryMs: number,
    options: SlotCacheOptions = {},
  ) {
    this.healEveryMs = options.healEveryMs ?? fullEveryMs * 10;
  }

  changed(name?: string): void {
    if (name === undefined) this.full = true;
    else if (name === SLOT_MANIFEST_FILE) this.manifestPending = true;
    else this.pending.add(name);
  }

  async current(now = Date.now()): Promise<SlotListing> {
    await this.serialised(() => this.refresh(now));
    const slots: SlotFile[] = [];
    const errors: SlotListing['errors'] = [];
    if (this.manifestError !== undefined) errors.push({ file: SLOT_MANIFEST_FILE, error: this.manifestError });
    for (const entry of this.union.values()) {
      if ('error' in entry) errors.push({ file: entry.file, error: entry.error });
      else slots.push(entry);
    }
    return { slots, errors };
  }

  /** The slot ids that exist (a file, valid or not, or a manifest entry) as of the last read. */
  present(): Set<string> {
    return new Set(this.union.keys());
  }

  /**
   * Whether the slot exists now: its file is there, or the manifest (re-read first if it
   * was reported changed) names it. For the renewal's "retired while waiting" checks: a
   * stat, and one manifest read per change of it.
   */
  async exists(slot: string): Promise<boolean> {
    let st: Stats | undefined;
    try {
      st = lstatSync(join(this.paths.slots, slotFileName(slot)), { throwIfNoEntry: false });
    } catch {
      st = undefined;
    }
    if (st !== undefined) return true;
    if (this.manifestPending) await this.serialised(() => this.refreshManifestOnly());
    return this.manifestIds.has(slot);
  }

  /** Re-reads what was reported changed (or every changed file, when a rescan is due) and says what changed. */
  async changes(now = Date.now()): Promise<SlotChanges> {
    return this.serialised(async () => {
      await this.refresh(now);
      const out: SlotChanges = { full: this.diffFull, updated: [...this.diffUpdated.values()], removed: [...this.diffRemoved] };
      this.diffFull = false;
      this.diffUpdated.clear();
      this.diffRemoved.clear();
      return out;
    });
  }

  private serialised<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.running.then(fn);
    this.running = run.catch(() => undefined);
    return run;
  }

  /** The slot as the union now has it: its file's entry, or an empty slot from the manifest. */
  private entryOf(slot: string): SlotEntry | undefined {
    return this.byFile.get(slotFileName(slot)) ?? (this.manifestIds.has(slot) ? emptySlotFile(slot) : undefined);
  }

  /** The union and the diff follow what the slot now is. */
  private settle(slot: string): void {
    const entry = this.entryOf(slot);
    if (entry === undefined) {
      if (!this.union.delete(slot)) return;
      this.diffUpdated.delete(slot);
      this.diffRemoved.add(slot);
    } else {
      this.union.set(slot, entry);
      this.diffRemoved.delete(slot);
      this.diffUpdated.set(slot, entry);
    }
  }

  private async refreshManifestOnly(): Promise<void> {
    if (!this.manifestPending) return;
    this.manifestPending = false;
    this.namesSinceRescan += 1;
    const before = this.manifestIds;
    if ((await this.loadManifest()) === 'kept') return;
    // Only the ids that came or went, and only those without a file, change the union.
    for (const slot of before) if (!this.manifestIds.has(slot) && !this.byFile.has(slotFileName(slot))) this.settle(slot);
    for (const slot of this.manifestIds) if (!before.has(slot) && !this.byFile.has(slotFileName(slot))) this.settle(slot);
  }

  private async refresh(now: number): Promise<void> {
    const rescan = this.full ? 'every file' : this.burstRescanIn(now) === 0 ? 'changed files' : now - this.lastCheck >= this.fullEveryMs ? await this.rescanDue(now) : undefined;
    if (rescan === undefined) {
      await this.refreshManifestOnly();
      const names = [...this.pending];
      this.pending.clear();
      this.namesSinceRescan += names.length;
      for (const name of names) {
        const slot = slotOfFileName(name);
        if (slot !== undefined && (await this.load(name)) !== 'kept') this.settle(slot);
      }
      return;
    }
    const force = rescan === 'every file';
    this.full = false;
    this.lastCheck = now;
    this.lastRescan = now;
    this.stats.rescans += 1;
    this.namesSinceRescan = 0;
    this.pending.clear();
    this.manifestPending = false;
    // Before the listing: a change made while the rescan runs moves the mtime past this.
    this.dirSeen = await this.dirIdentity();
    let names: string[] = [];
    try {
      names = await readdir(this.paths.slots);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    if (!names.includes(SLOT_MANIFEST_FILE)) this.clearManifest();
    else if (force || !this.sameOnDisk(SLOT_MANIFEST_FILE, this.manifestIdentity)) await this.loadManifest();
    // The directory as it is now: an entry that cannot be read at a rescan is not kept
    // (between rescans it is, see load()).
    const listed = new Set<string>();
    let sinceYield = 0;
    for (const name of names.sort()) {
      if (slotOfFileName(name) === undefined) continue;
      listed.add(name);
      if (!force && this.byFile.has(name)) {
        if (++sinceYield >= LSTAT_BATCH) {
          sinceYield = 0;
          await new Promise<void>((resolve) => setImmediate(resolve));
        }
        if (this.sameOnDisk(name, this.identities.get(name))) continue;
      }
      this.stats.rescanReads += 1;
      if ((await this.load(name)) === 'kept') this.drop(name);
    }
    for (const name of [...this.byFile.keys()]) if (!listed.has(name)) this.drop(name);
    // Every slot there is, in order, reported whole (SlotChanges.full).
    const slots = new Set<string>(this.manifestIds);
    for (const name of this.byFile.keys()) slots.add(slotOfFileName(name)!);
    const gone = [...this.union.keys()].filter((slot) => !slots.has(slot));
    this.union.clear();
    this.diffFull = true;
    for (const slot of gone) {
      this.diffUpdated.delete(slot);
      this.diffRemoved.add(slot);
    }
    for (const slot of [...slots].sort()) this.settle(slot);
  }

  private sameOnDisk(name: string, known: FileIdentity | undefined): boolean {
    let st: Stats | undefined;
    try {
      st = lstatSync(join(this.paths.slots, name), { throwIfNoEntry: false });
    } catch {
      st = undefined;
    }
    return st !== undefined && sameIdentity(known, identityOf(st));
  }

  private clearManifest(): void {
    this.manifestIds = new Set();
    this.manifestIdentity = undefined;
    this.manifestError = undefined;
  }

  /**
   * Reads the manifest: 'read' (its ids now, none if absent or refused) or 'kept' (it could
   * not be read for now: the last ids stay). Bounded, never through a symlink or a FIFO.
   */
  private async loadManifest(): Promise<'read' | 'kept'> {
    this.stats.manifestReads += 1;
    let text: string;
    let identity: FileIdentity;
    try {
      const file = await readBoundedRegularFile(slotManifestPath(this.paths), MAX_MANIFEST_BYTES);
      text = file.text;
      identity = identityOf(file.stat);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        this.clearManifest();
        return 'read';
      }
      if (err instanceof UnsafeFileError) {
        this.clearManifest();
        this.manifestError = err.reason === 'symlink' ? 'is a symlink (not followed)' : err.reason === 'not-regular' ? 'is not a regular file' : `is larger than ${MAX_MANIFEST_BYTES} bytes`;
        return 'read';
      }
      return 'kept';
    }
    const parsed = parseSlotManifest(text);
    this.manifestIds = parsed.ok ? parsed.slots : new Set();
    this.manifestIdentity = identity;
    this.manifestError = parsed.ok ? undefined : parsed.error;
    return 'read';
  }

  /**
   * How long until `changes()` next has a rescan to run, for a caller that sleeps between
   * calls: 0 when one is due; otherwise the time to the burst rescan owed (BURST_NAMES), or
   * to the periodic check.
   */
  nextCheckIn(now = Date.now()): number {
    if (this.full) return 0;
    const burst = this.burstRescanIn(now);
    return Math.max(0, Math.min(burst ?? Infinity, this.lastCheck + this.fullEveryMs - now));
  }
  /** undefined when no burst rescan is owed; else ms until it may run (0: now). */
  private burstRescanIn(now: number): number | undefined {
    if (this.namesSinceRescan + this.pending.size < BURST_NAMES) return undefined;
    return Math.max(0, this.lastRescan + BURST_RESCAN_MS - now);
  }

  /**
   * At a periodic check: whether to rescan ('changed files') or not (undefined). The check
   * itself is one stat of the directory.
   */
  private async rescanDue(now: number): Promise<'changed files' | undefined> {
    this.lastCheck = now;
    if (now - this.lastRescan >= this.healEveryMs) return 'changed files';
    const seen = this.dirSeen;
    if (seen === undefined) return 'changed files';
    const dir = await this.dirIdentity();
    if (dir === undefined || dir.ino !== seen.ino || dir.mtimeMs !== seen.mtimeMs || dir.ctimeMs !== seen.ctimeMs) return 'changed files';
    // Too recent, when it was seen, to be sure nothing changed after within the same tick
    // (a change then sets the mtime to the tick's time; the ctime of a directory whose
    // mtime was set back by hand is no such sign).
    if (seen.at - seen.mtimeMs < DIR_SETTLE_MS) return 'changed files';
    return undefined;
  }

  private async dirIdentity(): Promise<DirIdentity | undefined> {
    try {
      const at = Date.now();
      const st = await stat(this.paths.slots);
      return { ino: st.ino, mtimeMs: st.mtimeMs, ctimeMs: st.ctimeMs, at };
    } catch {
      return undefined;
    }
  }

  private drop(name: string): void {
    this.byFile.delete(name);
    this.identities.delete(name);
  }

  /** Reads one slot file into the cache: its new entry, 'gone', or 'kept' (unreadable: its last entry stays). */
  private async load(name: string): Promise<LoadOutcome> {
    const slot = slotOfFileName(name);
    if (!slot) return 'kept';
    let text: string;
    let identity: FileIdentity;
    try {
      // Bounded, never through a symlink or a FIFO: the link's group can create entries here.
      const file = await readBoundedRegularFile(join(this.paths.slots, name), MAX_SLOT_FILE_BYTES);
      text = file.text;
      identity = identityOf(file.stat);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        // Gone means no file at all.
        this.drop(name);
        return 'gone';
      }
      // A file that cannot be read (for now, or refused unread) keeps its last entry.
      return 'kept';
    }
    const parsed = slotEntry(name, text);
    const entry: SlotEntry | undefined = parsed === undefined ? undefined : 'error' in parsed ? { slot, file: name, error: parsed.error } : parsed;
    if (entry === undefined) {
      this.drop(name);
      return 'gone';
    }
    this.byFile.set(name, entry);
    this.identities.set(name, identity);
    return entry;
  }
}

type LoadOutcome = SlotEntry | 'gone' | 'kept';
