import { chmod, constants, copyFile, lstat, mkdir, readdir, readlink, symlink } from 'node:fs/promises';
import { join } from 'node:path';

export type EntryKind = 'dir' | 'file' | 'link' | 'other';

/**
 * Asked for each entry below the copied root, by its path relative to the root
 * (`a/b`): false leaves it out, and a folder left out is not read at all.
 */
export type KeepEntry = (rel: string, kind: EntryKind) => boolean | Promise<boolean>;

interface Typed {
  isDirectory(): boolean;
  isFile(): boolean;
  isSymbolicLink(): boolean;
}

/**
 * Copies `src` (a file, a folder or a symlink) to `dest`, which must not exist: folders
 * with their modes, files with their content and mode (copyFile sets the source's mode,
 * whatever the umask), symlinks as written, never followed nor made absolute. Owners and
 * times are not kept: the copy is the caller's (root's, for install). Anything else (a
 * FIFO, a socket, a device) is an error naming it.
 *
 * Why not fs.cp: on install's 5 000 files (docs/install.md, "What install copies") it took
 * twice the time and CPU of this, or of `cp -a`: it stats every source and destination
 * and chmods every file, one call after the other. Here a folder's entries are copied at
 * once, one copyFile a file, all queued to libuv's thread pool (four threads: the number
 * of files open at a time stays small).
 */
export async function copyTree(src: string, dest: string, keep: KeepEntry = () => true): Promise<void> {
  await copyEntry(src, dest, '', await lstat(src), keep);
}

async function copyEntry(src: string, dest: string, rel: string, type: Typed, keep: KeepEntry): Promise<void> {
  if (type.isSymbolicLink()) return symlink(await readlink(src), dest);
  if (type.isFile()) return copyFile(src, dest, constants.COPYFILE_EXCL);
  if (!type.isDirectory()) throw new Error(`${src}: not a file, folder or symlink; nothing else is copied`);
  const [mode, entries] = await Promise.all([lstat(src).then((s) => s.mode & 0o7777), readdir(src, { withFileTypes: true })]);
  await mkdir(dest);
  await Promise.all(
    entries.map(async (e) => {
      const childRel = rel === '' ? e.name : `${rel}/${e.name}`;
      const kind: EntryKind = e.isDirectory() ? 'dir' : e.isSymbolicLink() ? 'link' : e.isFile() ? 'file' : 'other';
      if (await keep(childRel, kind)) await copyEntry(join(src, e.name), join(dest, e.name), childRel, e, keep);
    }),
  );
  // The mode last, as fs.cp does: a read-only folder is still written into first.
  await chmod(dest, mode);
}
