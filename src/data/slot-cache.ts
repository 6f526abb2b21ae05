import { lstatSync, type Stats } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { readBoundedRegularFile } from '../fs/bounded-read.js';
import { MAX_SLOT_FILE_BYTES, slotEntry, slotOfFileName, type HandoffPaths, type SlotFile } from './handoff.js';

export interface SlotListing {
  slots: SlotFile[];
  errors: Array<{ file: string; error: string }>;
}

/** A slot file as last read: the slot, or why its file is invalid (it still exists). */
export type SlotEntry = SlotFile | { slot: string; file: string; error: string };

/**
 * What changed since the previous `changes()`: the renewal's due-queue is fed from this,
 * so a wake costs the files that changed, not a walk over every slot.
 */
export interface SlotChanges {
  /** The whole directory was looked at: `updated` holds every slot file there is. */
  full: boolean;
  /** Slot files read since the last call, each as it now is (a slot at most once). */
  updated: SlotEntry[];
  /** Slots whose file is gone (by name: a file unreadable for a moment is still there). */
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
 * The slot files of a hand-off directory, kept in memory and re-read only where a watcher
 * said a file changed (`changed(name)`), with a full rescan at start, on `changed()`
 * without a name, and when a periodic check finds it due (a dropped file event heals there).
 * With 10 000 slots a renewal then costs one file read, not 10 000.
 *
 * The periodic check (every `fullEveryMs`) costs one stat of the directory while nothing
 * in it changed: every writer of slot files (apply) renames a new file in, and a create,
 * rename or removal moves the directory's mtime. When it moved (or was too recent to trust,
 * DIR_SETTLE_MS), the rescan lists the directory and reads only the files whose identity
 * (lstat: inode, size, mtime, ctime) differs from the one read; at least every
 * `healEveryMs` it does so even with the directory unchanged (an edit in place whose event
 * was lost). `changed()` without a name re-reads every file. A host at rest with 10 000
 * slots then costs a stat a minute here, not 10 000 reads and parses (docs/scale.md, "Idle").
 *
 * One consumer per cache: `current()` (the whole listing, presence) or `changes()` (what
 * changed since its previous call, renewal).
 */
export class SlotCache {
  private readonly byFile = new Map<string, SlotEntry>();
  /** The identity of each file as last read (by fstat of what was read). */
  private readonly identities = new Map<string, FileIdentity>();
  private readonly pending = new Set<string>();
  /** Re-read every file at the next call (start, `changed()` without a name). */
  private full = true;
  private lastCheck = 0;
  private lastRescan = 0;
  /** The directory as it was just before the last rescan listed it; undefined: look again. */
  private dirSeen: DirIdentity | undefined;
  private readonly healEveryMs: number;
  /** Names re-read since the last rescan (BURST_NAMES). */
  private namesSinceRescan = 0;
  /** Rescans so far, and files read by them (what the periodic check costs; tests and bench). */
  readonly stats = { rescans: 0, rescanReads: 0 };

  constructor(
    private readonly paths: HandoffPaths,
    private readonly fullEveryMs: number,
    options: SlotCacheOptions = {},
  ) {
    this.healEveryMs = options.healEveryMs ?? fullEveryMs * 10;
  }

  changed(name?: string): void {
    if (name === undefined) this.full = true;
    else this.pending.add(name);
  }

  async current(now = Date.now()): Promise<SlotListing> {
    await this.changes(now);
    const slots: SlotFile[] = [];
    const errors: SlotListing['errors'] = [];
    for (const entry of this.byFile.values()) {
      if ('error' in entry) errors.push({ file: entry.file, error: entry.error });
      else slots.push(entry);
    }
    return { slots, errors };
  }

  /** The slot ids whose files exist (valid or not) as of the last `current()`. */
  present(): Set<string> {
    return new Set([...this.byFile.keys()].flatMap((name) => slotOfFileName(name) ?? []));
  }

  /** Re-reads what was reported changed (or every changed file, when a rescan is due) and says what changed. */
  async changes(now = Date.now()): Promise<SlotChanges> {
    const updated = new Map<string, SlotEntry>();
    const removed = new Set<string>();
    const apply = (name: string, outcome: LoadOutcome): void => {
      const slot = slotOfFileName(name);
      if (slot === undefined || outcome === 'kept') return;
      if (outcome === 'gone') {
        updated.delete(slot);
        removed.add(slot);
      } else {
        removed.delete(slot);
        updated.set(slot, outcome);
      }
    };
    const rescan = this.full ? 'every file' : this.burstRescanIn(now) === 0 ? 'changed files' : now - this.lastCheck >= this.fullEveryMs ? await this.rescanDue(now) : undefined;
    if (rescan !== undefined) {
      const force = rescan === 'every file';
      this.full = false;
      this.lastCheck = now;
      this.lastRescan = now;
      this.stats.rescans += 1;
      this.namesSinceRescan = 0;
      this.pending.clear();
      // Before the listing: a change made while the rescan runs moves the mtime past this.
      this.dirSeen = await this.dirIdentity();
      let names: string[] = [];
      try {
        names = await readdir(this.paths.slots);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
      // The directory as it is now: an entry that cannot be read at a rescan is not kept
      // (between rescans it is, see load()).
      const before = new Set(this.byFile.keys());
      const listed = new Set<string>();
      let sinceYield = 0;
      for (const name of names.sort()) {
        if (slotOfFileName(name) === undefined) continue;
        listed.add(name);
        const known = this.byFile.get(name);
        if (!force && known !== undefined) {
          if (++sinceYield >= LSTAT_BATCH) {
            sinceYield = 0;
            await new Promise<void>((resolve) => setImmediate(resolve));
          }
          let st: Stats | undefined;
          try {
            st = lstatSync(join(this.paths.slots, name), { throwIfNoEntry: false });
          } catch {
            st = undefined;
          }
          if (st !== undefined && sameIdentity(this.identities.get(name), identityOf(st))) {
            apply(name, known);
            continue;
          }
        }
        this.stats.rescanReads += 1;
        const outcome = await this.load(name);
        if (outcome === 'kept') this.drop(name);
        apply(name, outcome);
      }
      for (const name of before) {
        if (listed.has(name) && this.byFile.has(name)) continue;
        this.drop(name);
        apply(name, 'gone');
      }
      return { full: true, updated: [...updated.values()], removed: [...removed] };
    }
    const names = [...this.pending];
    this.pending.clear();
    this.namesSinceRescan += names.length;
    for (const name of names) apply(name, await this.load(name));
    return { full: false, updated: [...updated.values()], removed: [...removed] };
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

  /** Reads one file into the cache: its new entry, 'gone', or 'kept' (unreadable: its last entry stays). */
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
