import { readFile } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import type { ParseResult } from '../data/parse.js';

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
  parse: (text: string) => ParseResult<T>;
  /** The value of a missing file (an empty registry/catalog). */
  empty: T;
  onLoad?: (state: HotState<T>, change: { ok: boolean; missing: boolean }) => void;
  debounceMs?: number;
}

/**
 * A JSON config file that reloads itself: watched through its directory (writers rename
 * into place, which a watch on the file itself would lose), reloadable on demand (SIGHUP).
 * A bad file never replaces a good one: the last good value stays in force and the state
 * turns `degraded` until a good file loads. A missing file is an empty config.
 */
export class HotFile<T> {
  private state: HotState<T>;
  private watcher: FSWatcher | undefined;
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
    await this.reload();
    const name = basename(this.options.path);
    this.watcher = watch(dirname(this.options.path), {
      ignoreInitial: true,
      depth: 0,
      // Follow a symlinked directory or file, re-resolved on every event.
      followSymlinks: true,
    });
    const onEvent = (path: string): void => {
      if (basename(path) === name) this.schedule();
    };
    this.watcher.on('add', onEvent).on('change', onEvent).on('unlink', onEvent);
    // chokidar drops a second `change` for the same path within 50 ms and never replays it,
    // which would lose a quick bind-then-unbind. Raw events are not throttled; our own
    // debounce merges bursts.
    this.watcher.on('raw', (_event: string, path: string) => {
      if (basename(path) === name) this.schedule();
    });
    this.watcher.on('error', () => this.schedule());
    await new Promise<void>((resolve) => this.watcher?.once('ready', () => resolve()));
  }

  private schedule(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.reload();
    }, this.options.debounceMs ?? 30);
  }

  /** Re-reads the path afresh (it may now resolve through a different symlink). Serialised. */
  reload(): Promise<void> {
    this.loading = this.loading.then(() => this.load());
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
    const parsed = this.options.parse(text);
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
    if (this.timer) clearTimeout(this.timer);
    await this.watcher?.close();
    await this.loading;
  }
}
