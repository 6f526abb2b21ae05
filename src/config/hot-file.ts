import { readFile, realpath } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import type { ParseResult } from '../data/parse.js';
import { watchDir } from '../fs/dir-watch.js';

export type HotStatus = 'ok' | 'degraded';

export interface HotState<T> {
  value: T;
  status: HotStatus;
  /** Why the last load failed; never contains file content. */
  error?: string;
  /** Increments on every successful load, for logs and tests. */
  generation: number;
}

export interface HotFileOptions<T> {
  path: string;
  /** `previous`: the value in force (the last good load, or `empty`), for a parser that reuses what did not change. */
  parse: (text: string, previous?: T) => ParseResult<T>;
  /** The value of a missing file (an empty registry/catalog). */
  empty: T;
  onLoad?: (state: HotState<T>, change: { ok: boolean; missing: boolean }) => void;
  debounceMs?: number;
}

/**
 * A JSON config file that reloads itself: watched through its directory, filtered by its
 * name (writers rename into place, which replaces the inode a watch on the file itself
 * would hold), reloadable on demand (SIGHUP). The directory may be missing, or removed
 * and made again: it is watched once it exists.
 * A bad file never replaces a good one: the last good value stays in force and the state
 * turns `degraded` until a good file loads. A missing file is an empty config.
 */
export class HotFile<T> {
  private state: HotState<T>;
  private unwatch: (() => void) | undefined;
  /** What the watch holds, resolved: a re-pointed symlink is followed after the next load. */
  private watched: string | undefined;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private loading: Promise<void> = Promise.resolve();

  constructor(private readonly options: HotFileOptions<T>) {
    this.state = { value: options.empty, status: 'ok', generation: 0 };
  }

  get current(): HotState<T> {
    return this.state;
  }

  /** Loads once and starts watching. Resolves after the first load, good or bad. */
  async start(): Promise<void> {
    // Watching first: a change made while the first load runs is read again after it.
    await this.watch();
    await this.reload();
  }

  /**
   * Watches the file's directory for its name and, when the file is a symlink into another
   * directory, that directory for the target's name too (a write there names no entry
   * here). Both are resolved again on every load; a change of either re-arms.
   */
  private async watch(): Promise<void> {
    const path = this.options.path;
    const targets = [{ dir: dirname(path), name: basename(path) }];
    const real = await realpath(path).catch(() => undefined);
    const realDir = await realpath(dirname(path)).catch(() => dirname(path));
    if (real !== undefined && dirname(real) !== realDir) targets.push({ dir: dirname(real), name: basename(real) });
    const key = JSON.stringify([realDir, ...targets.slice(1)]);
    if (this.closed || (this.unwatch && key === this.watched)) return;
    this.unwatch?.();
    this.watched = key;
    // Every event naming the file is followed by a fresh read after the debounce, however
    // many come and however close together (chokidar, the watcher before this, dropped a
    // second `change` within 50 ms, which lost a quick bind-then-unbind). An unnamed event
    // or an error may hide a change to the file: read it too.
    const stops = targets.map(({ dir, name }) =>
      watchDir(
        dir,
        (changed) => {
          if (changed === name || changed === undefined) this.schedule();
        },
        () => this.schedule(),
        { reappear: true },
      ),
    );
    this.unwatch = () => stops.forEach((stop) => stop());
  }

  private schedule(): void {
    if (this.closed) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.reload();
    }, this.options.debounceMs ?? 30);
  }

  /**
   * Re-reads the path afresh. The watch is re-armed first, on wherever the path resolves
   * now (a re-pointed symlink's new target directory), so a change made after the read is
   * always seen: re-armed after the read, a write into the new directory in between was
   * lost (busy-suite). Serialised.
   */
  reload(): Promise<void> {
    this.loading = this.loading.then(async () => {
      if (this.unwatch) await this.watch();
      await this.load();
    });
    return this.loading;
  }

  private async load(): Promise<void> {
    let text: string;
    try {
      text = await readFile(this.options.path, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') {
        this.state = { value: this.options.empty, status: 'ok', generation: this.state.generation + 1 };
        this.options.onLoad?.(this.state, { ok: true, missing: true });
        return;
      }
      this.fail(`cannot read file (${code ?? 'error'})`);
      return;
    }
    const parsed = this.options.parse(text, this.state.value);
    if (!parsed.ok) {
      this.fail(parsed.error);
      return;
    }
    this.state = { value: parsed.value, status: 'ok', generation: this.state.generation + 1 };
    this.options.onLoad?.(this.state, { ok: true, missing: false });
  }

  private fail(error: string): void {
    this.state = { ...this.state, status: 'degraded', error };
    this.options.onLoad?.(this.state, { ok: false, missing: false });
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.unwatch?.();
    await this.loading;
    // A load that was running may have scheduled another.
    if (this.timer) clearTimeout(this.timer);
  }
}
