import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { readSlotText, slotEntry, slotOfFileName, type HandoffPaths, type SlotFile } from './handoff.js';

export interface SlotListing {
  slots: SlotFile[];
  errors: Array<{ file: string; error: string }>;
}

/**
 * The slot files of a hand-off directory, kept in memory and re-read only where a watcher
 * said a file changed (`changed(name)`), with a full rescan at start, on `changed()`
 * without a name, and at least every `fullEveryMs` (a dropped file event heals there).
 * With 10 000 slots a renewal then costs one file read, not 10 000.
 */
export class SlotCache {
  private readonly byFile = new Map<string, SlotFile | { error: string }>();
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
    if (this.full || now - this.lastFull >= this.fullEveryMs) {
      this.full = false;
      this.lastFull = now;
      this.pending.clear();
      this.byFile.clear();
      let names: string[] = [];
      try {
        names = await readdir(this.paths.slots);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
      for (const name of names.sort()) await this.load(name);
    } else {
      const names = [...this.pending];
      this.pending.clear();
      for (const name of names) await this.load(name);
    }
    const slots: SlotFile[] = [];
    const errors: SlotListing['errors'] = [];
    for (const [file, entry] of this.byFile) {
      if ('error' in entry) errors.push({ file, error: entry.error });
      else slots.push(entry);
    }
    return { slots, errors };
  }

  /** The slot ids whose files exist (valid or not) as of the last `current()`. */
  present(): Set<string> {
    return new Set([...this.byFile.keys()].flatMap((name) => slotOfFileName(name) ?? []));
  }

  private async load(name: string): Promise<void> {
    if (!slotOfFileName(name)) return;
    let text: string | undefined;
    try {
      // Bounded, never through a symlink or a FIFO: the link's group can create entries here.
      text = await readSlotText(join(this.paths.slots, name));
    } catch {
      // A file that cannot be read (for now, or refused unread) keeps its last entry.
      return;
    }
    if (text === undefined) {
      // Gone means no file at all.
      this.byFile.delete(name);
      return;
    }
    const entry = slotEntry(name, text);
    if (entry === undefined) this.byFile.delete(name);
    else this.byFile.set(name, entry);
  }
}
