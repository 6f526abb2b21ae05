import { randomFillSync } from 'node:crypto';
import { closeSync, constants, type Stats, fchmodSync, fchownSync, fstatSync, fsync, lstatSync, openSync, renameSync, statSync, unlinkSync, write, writeSync } from 'node:fs';
import { access, mkdir, open, readdir, unlink } from 'node:fs/promises';
import { promisify } from 'node:util';
import { basename, dirname, join } from 'node:path';
import { processAlive } from './process-alive.js';

export interface AtomicWriteOptions {
  /** Final mode of the file; the temp file is created with it so it is never more open. */
  mode?: number;
  /** Owner for the new file (root writing a service's file must not leave it root-owned). */
  owner?: { uid: number; gid: number };
  /**
   * Test hook: called after half the data is in the temp file, so a crash test can kill
   * the process mid-write and prove nothing partial ever becomes visible.
   */
  midWrite?: () => void;
}

/**
 * Writes `data` to `path` so that a reader sees either the old file or the new one, never
 * a partial one, even across a crash: temp file in the same directory, opened exclusively
 * with the final mode and O_NOFOLLOW, fsync, rename over the target, fsync the directory.
 * A symlink at the target is refused: rename would replace the link, silently changing
 * which file the operator thinks is being written. Returns the new file's stat (rename
 * keeps the inode): a caller can later tell its own file from a replaced one without
 * reading it back.
 */
export async function atomicWrite(path: string, data: string | Uint8Array, options: AtomicWriteOptions = {}): Promise<Stats> {
  const mode = options.mode ?? 0o600;
  const dir = dirname(path);
  refuseNonRegular(path);
  const tmp = tempPathFor(dir, basename(path));
  const bytes = typeof data === 'string' ? Buffer.from(data) : data;
  // Every step but the fsyncs is a synchronous call: for a file of a few hundred bytes each
  // awaited step cost several times the CPU of its system call (a hop to libuv's pool and
  // back), and renewal writes several such files per slot. The fsyncs wait on the disk, so
  // they stay off the event loop. A large file (a desired state) is written off it too.
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
  let written: Stats;
  try {
    const half = options.midWrite ? Math.floor(bytes.length / 2) : bytes.length;
    await writeBytes(fd, bytes.subarray(0, half));
    options.midWrite?.();
    await writeBytes(fd, bytes.subarray(half));
    // The umask may have narrowed the mode given to open(); set it exactly.
    fchmodSync(fd, mode);
    if (options.owner) fchownSync(fd, options.owner.uid, options.owner.gid);
    await fsyncFd(fd);
    written = fstatSync(fd);
  } catch (err) {
    closeQuietly(fd);
    unlinkQuietly(tmp);
    throw err;
  }
  closeSync(fd);
  try {
    renameSync(tmp, path);
  } catch (err) {
    unlinkQuietly(tmp);
    throw err;
  }
  await fsyncDir(dir);
  return written;
}

/** Above this, `atomicWrite` writes the data off the event loop. */
const SYNC_WRITE_MAX_BYTES = 64 * 1024;

const fsyncFd = promisify(fsync);
const writeFd = promisify(write);

async function writeBytes(fd: number, bytes: Uint8Array): Promise<void> {
  if (bytes.length <= SYNC_WRITE_MAX_BYTES) return writeAll(fd, bytes);
  for (let off = 0; off < bytes.length; ) off += (await writeFd(fd, bytes, off, bytes.length - off)).bytesWritten;
}

/** A symlink or a non-regular file at the target is refused; nothing there is fine. */
function refuseNonRegular(path: string): void {
  const st = lstatSync(path, { throwIfNoEntry: false });
  if (st?.isSymbolicLink()) throw new Error(`refusing to replace symlink at ${path}`);
  if (st && !st.isFile()) throw new Error(`refusing to replace non-regular file at ${path}`);
}

export function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // already closed
  }
}

/** Removes a file if it is there (a temp never created or already renamed, a file already gone). */
export function unlinkQuietly(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // never created, already renamed or already gone
  }
}

/**
 * `atomicWrite` for a small record written off the request path, where durability across
 * a power loss is not worth its price: synchronous calls (each of `atomicWrite`'s awaited
 * steps is a hop to libuv's thread pool and back, about four times the CPU of the calls
 * themselves) and no fsync (two per record capped the writer at the disk's fsync rate).
 * Still whole or absent to every reader and across a crash of the process; a power loss
 * within the kernel's writeback delay can lose the file or leave it empty. The temp name
 * is `atomicWrite`'s, so `sweepStaleTemps` removes what a killed writer left.
 */
export function atomicWriteSync(path: string, data: string, options: Pick<AtomicWriteOptions, 'mode' | 'midWrite'> = {}): void {
  const mode = options.mode ?? 0o600;
  refuseNonRegular(path);
  const tmp = tempPathFor(dirname(path), basename(path));
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
  try {
    const bytes = Buffer.from(data);
    const half = options.midWrite ? Math.floor(bytes.length / 2) : bytes.length;
    writeAll(fd, bytes.subarray(0, half));
    options.midWrite?.();
    writeAll(fd, bytes.subarray(half));
    fchmodSync(fd, mode); // the umask may have narrowed open()'s mode
    closeSync(fd);
    renameSync(tmp, path);
  } catch (err) {
    closeQuietly(fd);
    unlinkQuietly(tmp);
    throw err;
  }
}

function writeAll(fd: number, bytes: Uint8Array): void {
  for (let off = 0; off < bytes.length; ) off += writeSync(fd, bytes, off);
}

/**
 * When root writes into a directory owned by a service user, new files take the
 * directory's owner, so `bind` run by an operator never locks the service out.
 */
export async function ownerFor(dir: string): Promise<{ uid: number; gid: number } | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const st = statSync(dir);
  return st.uid === 0 ? undefined : { uid: st.uid, gid: st.gid };
}

async function syncDirOnce(dir: string): Promise<void> {
  const fd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    await fsyncFd(fd);
  } finally {
    closeSync(fd);
  }
}

/** Per directory: the fsync running now, and the one queued behind it (shared by every caller that arrived meanwhile). */
const dirSyncs = new Map<string, { running: Promise<void>; next: Promise<void> | undefined }>();

/**
 * Makes a rename in `dir` durable. Group commit: an fsync of a directory covers every
 * rename done in it before the fsync started, so callers arriving while one runs share
 * the single next one instead of each paying their own (renewal writes hundreds of files
 * a second into one directory; one fsync each capped it at the disk's fsync rate). A
 * caller never returns before an fsync that started after its call.
 */
export function fsyncDir(dir: string): Promise<void> {
  const entry = dirSyncs.get(dir);
  if (!entry) {
    const running = syncDirOnce(dir).finally(() => {
      const e = dirSyncs.get(dir);
      if (e?.running === running && e.next === undefined) dirSyncs.delete(dir);
    });
    dirSyncs.set(dir, { running, next: undefined });
    return running;
  }
  if (entry.next) return entry.next;
  const next = entry.running
    .catch(() => undefined)
    .then(() => {
      const mine = syncDirOnce(dir).finally(() => {
        const e = dirSyncs.get(dir);
        if (e?.running === mine && e.next === undefined) dirSyncs.delete(dir);
      });
      dirSyncs.set(dir, { running: mine, next: undefined });
      return mine;
    });
  entry.next = next;
  return next;
}

/**
 * Random bytes for temp names, drawn 4 KiB at a time: unguessable names (the link may
 * create entries in the hand-off's directories, and must not plant the next one) without
 * a call into the CSPRNG for every file (apply and the link write several per renewed slot).
 */
const tempRandom = Buffer.alloc(4096);
let tempRandomAt = tempRandom.length;

function tempSuffix(): string {
  if (tempRandomAt + 6 > tempRandom.length) {
    randomFillSync(tempRandom);
    tempRandomAt = 0;
  }
  const hex = tempRandom.toString('hex', tempRandomAt, tempRandomAt + 6);
  tempRandomAt += 6;
  return hex;
}

/**
 * `atomicWrite`'s temp name: `.<target name>.<writer pid>.<12 hex>.tmp`. Exported for a
 * writer of its own that must leave the same names (`sweepStaleTemps` removes them).
 */
export function tempPathFor(dir: string, target: string): string {
  return join(dir, `.${target}.${process.pid}.${tempSuffix()}.tmp`);
}

/** `tempPathFor`'s names, for the sweep. */
const TEMP_NAME = /^\.(.+)\.(\d+)\.[0-9a-f]{12}\.tmp$/;

/** Whether `name` is one of `atomicWrite`'s temp names (left to `sweepStaleTemps`, which knows whose). */
export function isTempName(name: string): boolean {
  return TEMP_NAME.test(name);
}

/**
 * Removes the temp files killed writers left in `dir` (never renamed into place, possibly
 * holding part of a secret), only those whose writer is gone: a live writer's temp is
 * about to be renamed. With `target`, only the temps of that one file name. The one sweep
 * for every writer: fetch (inbox/, its private state) and apply (token files' directories).
 * Returns the names removed, for the log.
 */
export async function sweepStaleTemps(dir: string, options: { target?: string } = {}): Promise<string[]> {
  const removed: string[] = [];
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const m = TEMP_NAME.exec(name);
    if (!m || (options.target !== undefined && m[1] !== options.target)) continue;
    const pid = Number(m[2]);
    if (!Number.isSafeInteger(pid) || pid <= 0 || pid === process.pid || processAlive(pid)) continue;
    await unlink(join(dir, name)).catch(() => undefined);
    removed.push(name);
  }
  return removed;
}

const WRITE_PROBLEMS: Record<string, string> = {
  EACCES: 'permission denied',
  EPERM: 'permission denied',
  EROFS: 'read-only file system',
  ENOTDIR: 'not a directory',
  ENOSPC: 'no space left',
  EDQUOT: 'disk quota exceeded',
};

/**
 * Vault's sink write-check: proves at start that `atomicWrite` can write into `dir`
 * (created if missing, with `mode`) by creating and removing a temp file the way it would,
 * so a service that cannot write its files fails at once with a clear message instead of
 * at the first renewal. The probe is named like a temp file: a crash leaves it sweepable.
 * `probe: false` asks the kernel instead (access(2): modes, read-only mounts) for a
 * directory where any write is an event: a probe in the hand-off inbox would start
 * apply's `.path` unit, and apply's own probe would start it again, for ever.
 */
export async function checkWritableDir(dir: string, what: string, options: { mode?: number; probe?: boolean } = {}): Promise<void> {
  try {
    await mkdir(dir, { recursive: true, ...(options.mode === undefined ? {} : { mode: options.mode }) });
    if (options.probe === false) {
      await access(dir, constants.W_OK | constants.X_OK);
      return;
    }
    const probe = tempPathFor(dir, 'write-check');
    const fh = await open(probe, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    await fh.close();
    await unlink(probe);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new Error(`cannot write ${what} in ${dir}: ${WRITE_PROBLEMS[code] ?? code}`);
  }
}
