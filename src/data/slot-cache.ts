import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { readSlotText, slotEntry, slotOfFileName, type HandoffPaths, type SlotFile } from './handoff.js';

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
  /** A full rescan happened: `updated` holds every slot file there is. */
  full: boolean;
  /** Slot files read since the last call, each as it now is (a slot at most once). */
  updated: SlotEntry[];
  /** Slots whose file is gone (by name: a file unreadable for a moment is still there). */
  removed: string[];
}

/**
 * The slot files of a hand-off directory, kept in memory and re-read only where a watcher
 * said a file changed (`changed(name)`), with a full rescan at start, on `changed()`
 * without a name, and at least every `fullEveryMs` (a dropped file event heals there).
 * With 10 000 slots a renewal then costs one file read, not 10 000.
 *
 * One consumer per cache: `current()` (the whole listing, presence) or `changes()` (what
 * changed since its previous call, renewal).
 */
export class SlotCache {
  private readonly byFile = new Map<string, SlotEntry>();
  private readonly pending = new Set<string>();
  private full = true;
  private lastFull = 0;

  constructor(
    private readonly paths: HandoffPaths,
    private readonly fullEveryMs: number,
  ) {}

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

  /** Re-reads what was reported changed (or everything, when a rescan is due) and says what changed. */
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
    if (this.full || now - this.lastFull >= this.fullEveryMs) {
      this.full = false;
      this.lastFull = now;
      this.pending.clear();
      let names: string[] = [];
      try {
        names = await readdir(this.paths.slots);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
      // The directory as it is now: an entry that cannot be read at a rescan is not kept
      // (between rescans it is, see load()).
      const before = [...this.byFile.keys()];
      this.byFile.clear();
      for (const name of names.sort()) apply(name, await this.load(name));
      for (const name of before) if (!this.byFile.has(name)) apply(name, 'gone');
      return { full: true, updated: [...updated.values()], removed: [...removed] };
    }
    const names = [...this.pending];
    this.pending.clear();
    for (const name of names) apply(name, await this.load(name));
    return { full: false, updated: [...updated.values()], removed: [...removed] };
  }

  /** Reads one file into the cache: its new entry, 'gone', or 'kept' (unreadable: its last entry stays). */
  private async load(name: string): Promise<LoadOutcome> {
    const slot = slotOfFileName(name);
    if (!slot) return 'kept';
    let text: string | undefined;
    try {
      // Bounded, never through a symlink or a FIFO: the link's group can create entries here.
      text = await readSlotText(join(this.paths.slots, name));
    } catch {
      // A file that cannot be read (for now, or refused unread) keeps its last entry.
      return 'kept';
    }
    if (text === undefined) {
      // Gone means no file at all.
      this.byFile.delete(name);
      return 'gone';
    }
    const parsed = slotEntry(name, text);
    const entry: SlotEntry | undefined = parsed === undefined ? undefined : 'error' in parsed ? { slot, file: name, error: parsed.error } : parsed;
    if (entry === undefined) {
      this.byFile.delete(name);
      return 'gone';
    }
    this.byFile.set(name, entry);
    return entry;
  }
}

type LoadOutcome = SlotEntry | 'gone' | 'kept';
