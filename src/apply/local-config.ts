import type { Stats } from 'node:fs';
import { stat } from 'node:fs/promises';
import { readCatalog, type Catalog } from '../data/catalog.js';
import { readInstances, type InstancesFile } from '../data/registry.js';

type FileKey = string;

/** Atomic writes replace the inode; an edit in place changes the size or the mtime. */
function keyOf(st: Pick<Stats, 'ino' | 'size' | 'mtimeMs'> | undefined): FileKey {
  return st ? `${st.ino}:${st.size}:${st.mtimeMs}` : 'missing';
}

/**
 * A config file as apply last read or wrote it. What apply wrote it keeps (with the
 * written file's stat) instead of reading it back; the file is parsed again only when it
 * is no longer that file: at start, and when someone else changed it (`bind`, or an
 * operator's hand edit on a host without a desired state). With 10 000 bindings a parse
 * per token made applying them quadratic; a stat per token does not.
 */
export class RememberedFile<T> {
  private last: { key: FileKey; value: T } | undefined;

  constructor(
    readonly path: string,
    private readonly read: (path: string) => Promise<T>,
  ) {}

  /** The file's content; an invalid file throws (the caller decides what that means). */
  async get(): Promise<T> {
    const key = keyOf(await stat(this.path).catch(() => undefined));
    if (this.last?.key === key) return this.last.value;
    // Replaced between the stat and the read: the next stat differs, so that is read again.
    const value = await this.read(this.path);
    this.last = { key, value };
    return value;
  }

  /** `value` was just written to the file, which `atomicWrite` reported as `written`. */
  wrote(value: T, written: Stats): void {
    this.last = { key: keyOf(written), value };
  }
}

/** The registry and the catalog, the two files apply writes and reads its token targets from. */
export interface LocalConfigFiles {
  instances: RememberedFile<InstancesFile>;
  catalog: RememberedFile<Catalog>;
}

export function localConfigFiles(paths: { instances: string; providers: string }): LocalConfigFiles {
  return {
    instances: new RememberedFile(paths.instances, readInstances),
    catalog: new RememberedFile(paths.providers, readCatalog),
  };
}
