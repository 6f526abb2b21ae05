import { statSync, watch, type FSWatcher } from 'node:fs';
import { basename, dirname, relative, sep } from 'node:path';

export interface DirWatchOptions {
  /**
   * Outlive the directory: when it is missing at the start, or removed (and perhaps made
   * again) later, watch its nearest existing ancestor until it is back, then watch it
   * again and report `undefined` (rescan). Without this a missing directory is an error
   * and a removed one goes silent: inotify drops the watch with the inode.
   */
  reappear?: boolean;
}

/**
 * Watches one directory (not its subdirectories) with inotify and reports each changed
 * entry by name; `undefined` means "something changed, name unknown": rescan all. Writers'
 * temps (dot files) are ignored. Unlike chokidar, which re-lists and stats the whole
 * directory on every event, an event here costs the same with 10 000 files as with one
 * (docs/performance.md, "File watching": this is the program's one file watcher).
 * The kernel can drop events when its queue overflows and node does not say so: every
 * user of this also rescans on a timer, or reloads on SIGHUP.
 */
export function watchDir(dir: string, onChange: (name: string | undefined) => void, onError: (err: Error) => void, options: DirWatchOptions = {}): () => void {
  if (!options.reappear) {
    try {
      return watchRaw(dir, named(onChange), onError);
    } catch (err) {
      onError(err as Error);
      return () => undefined;
    }
  }
  return watchReappearing(dir, onChange, onError);
}

/** Every event, dot files included (the caller filters): `undefined` is an unnamed event or an error. */
function watchRaw(dir: string, onEvent: (name: string | undefined) => void, onError: (err: Error) => void): () => void {
  const watcher: FSWatcher = watch(dir, { persistent: true, encoding: 'utf8' }, (_event, name) => onEvent(name ?? undefined));
  watcher.on('error', (err) => {
    onError(err);
    onEvent(undefined);
  });
  return () => watcher.close();
}

const named = (onChange: (name: string | undefined) => void) => (name: string | undefined): void => {
  if (name === undefined || !name.startsWith('.')) onChange(name);
};

function inode(path: string): number | undefined {
  try {
    const st = statSync(path);
    return st.isDirectory() ? st.ino : undefined;
  } catch {
    return undefined;
  }
}

/**
 * When the watched directory goes, inotify reports an event named after the directory
 * itself (IN_DELETE_SELF, as node passes it on), then nothing more: that event re-arms
 * (an entry of the same name inside costs a needless re-arm and rescan), and so does an
 * unnamed event or an error that finds the directory gone or another one in its place.
 * Until it exists, its nearest existing ancestor is watched for the next component of
 * the path to appear.
 */
function watchReappearing(dir: string, onChange: (name: string | undefined) => void, onError: (err: Error) => void): () => void {
  const self = basename(dir);
  const report = named(onChange);
  let stop: () => void = () => undefined;
  let stopped = false;
  let watchedIno: number | undefined;

  const arm = (): void => {
    stop();
    if (stopped) return;
    watchedIno = inode(dir);
    if (watchedIno !== undefined) {
      try {
        stop = watchRaw(
          dir,
          (name) => {
            // A directory removed and made again at once often gets the same inode number
            // back, so the self event re-arms whatever the inode says.
            if (name === self || (name === undefined && inode(dir) !== watchedIno)) {
              arm();
              onChange(undefined);
              return;
            }
            report(name);
          },
          onError,
        );
        return;
      } catch (err) {
        // Removed between the stat and the watch: watch the ancestor below.
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') onError(err as Error);
      }
    }
    let ancestor = dirname(dir);
    while (inode(ancestor) === undefined && dirname(ancestor) !== ancestor) ancestor = dirname(ancestor);
    const next = relative(ancestor, dir).split(sep)[0];
    try {
      stop = watchRaw(
        ancestor,
        (name) => {
          if (name !== next && name !== undefined) return;
          if (inode(dir) === undefined && inode(`${ancestor}${sep}${next}`) === undefined) return;
          arm();
          onChange(undefined);
        },
        onError,
      );
    } catch (err) {
      onError(err as Error);
      stop = () => undefined;
    }
    // Made between the look above and the ancestor's watch: nothing would report it.
    if (inode(dir) !== undefined) {
      arm();
      onChange(undefined);
    }
  };

  arm();
  return () => {
    stopped = true;
    stop();
  };
}
