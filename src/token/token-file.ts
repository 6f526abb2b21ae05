import { closeSync, constants, fstatSync, openSync, readSync, statSync, type Stats } from 'node:fs';

export const MAX_TOKEN_BYTES = 16 * 1024;

export type TokenFailure = 'missing' | 'unreadable' | 'empty' | 'malformed';

export type TokenRead = { ok: true; token: string } | { ok: false; reason: TokenFailure };

/** Visible ASCII only: no spaces, no control characters, no CR/LF inside the token. */
const VISIBLE_ASCII = /^[\x21-\x7e]+$/;

/** Strips exactly one trailing `\n` or `\r\n`, then validates what is left. */
export function parseToken(buf: Buffer): TokenRead {
  let end = buf.length;
  if (end > 0 && buf[end - 1] === 0x0a) {
    end -= 1;
    if (end > 0 && buf[end - 1] === 0x0d) end -= 1;
  }
  if (end === 0) return { ok: false, reason: 'empty' };
  if (end > MAX_TOKEN_BYTES) return { ok: false, reason: 'malformed' };
  const token = buf.toString('latin1', 0, end);
  if (!VISIBLE_ASCII.test(token)) return { ok: false, reason: 'malformed' };
  return { ok: true, token };
}

// Room for the largest valid token, its line ending, and one byte to detect "too long".
const READ_LIMIT = MAX_TOKEN_BYTES + 3;
// One buffer for every read: the read is synchronous and the token leaves it as a string
// copy, so nothing can see it change. (A fresh 16 KiB buffer per request cost an
// allocation outside V8's pool and external-memory pressure on the GC.)
const readBuffer = Buffer.alloc(READ_LIMIT);

/** An open token file: the descriptor, and what `stat(path)` must still say for it to be the file at the path. */
interface Held {
  fd: number;
  dev: number;
  ino: number;
  ctimeMs: number;
}

/**
 * Descriptors kept open, by path, least recently read first. Bounded: a host can have
 * thousands of bindings, and every descriptor held here is one fewer in the reserve the
 * connection limits keep for everything a request opens (src/http/peer-limits.ts: at
 * least 128). Opened by libuv with O_CLOEXEC: no child process inherits one.
 */
const held = new Map<string, Held>();
// The key last in `held` (or undefined): a forwarder with one binding reads one path on
// every request, and moving it to the end of the map each time was a delete and a set.
let newest: string | undefined;
export const MAX_HELD_TOKEN_FILES = 32;
const STAT_OPTIONS = { throwIfNoEntry: false } as const;

/**
 * Reads the token file afresh, on every call: the request uses the token that is on disk
 * at this moment (renewal replaces the file by rename at any time). Deliberately
 * synchronous: the file is tiny and local, and a sync read costs a few microseconds.
 *
 * The file's bytes are never cached, only its descriptor. A path read before costs
 * `stat(path)` and `pread(fd)` instead of open, fstat, read and close (half the system
 * calls; docs/performance.md). Why that is the same answer:
 *
 * - `stat(path)` follows the path as `open(path)` would (symlinks too). When it names the
 *   inode (device and inode number) the held descriptor was opened on, the path leads to
 *   that very file now: the inode cannot have been freed and its number reused, because
 *   the descriptor holds it. A rename, a re-pointed symlink or a deletion shows as another
 *   inode or as ENOENT, and the path is opened afresh (or reported missing).
 * - The bytes are then read through the descriptor, at offset 0, now: whatever was
 *   written into the file in place is read, whatever its timestamps say. No timestamp
 *   decides whether content changed, so a token rewritten in place within one tick of the
 *   clock (same size, same mtime) is read as it is now, never as it was.
 * - The change time is compared too, so a chmod or chown of the file (which a request
 *   should meet as open(2) would: EACCES) reopens it; that comparison only ever causes an
 *   extra open, never a stale read.
 *
 * A descriptor whose path went away (ENOENT) is closed at that read. One that is never
 * read again (a disconnected binding's token, whose route is gone; a deleted host
 * credential after a halt) would keep the unlinked file's blocks on disk, so a sweep
 * closes every held descriptor whose file has no name left (`sweepUnlinked`, once a second
 * while any is held): a deleted token or credential is gone from the disk within a second,
 * as SPEC §8 means by deleting it.
 */
export function readTokenFile(path: string): TokenRead {
  const h = held.get(path);
  if (h !== undefined) {
    let st: Stats | undefined;
    try {
      st = statSync(path, STAT_OPTIONS);
    } catch (err) {
      release(path, h);
      return { ok: false, reason: openFailure(err) };
    }
    if (st === undefined) {
      release(path, h);
      return { ok: false, reason: 'missing' };
    }
    if (st.ino === h.ino && st.dev === h.dev && st.ctimeMs === h.ctimeMs) {
      // Most recently used last: the bound evicts from the front.
      if (newest !== path) {
        held.delete(path);
        held.set(path, h);
        newest = path;
      }
      try {
        return parseToken(readAt(h.fd, st.size));
      } catch {
        release(path, h);
        return { ok: false, reason: 'unreadable' };
      }
    }
    release(path, h);
  }
  return openAndRead(path);
}

function openAndRead(path: string): TokenRead {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (err) {
    return { ok: false, reason: openFailure(err) };
  }
  let keep = false;
  try {
    const st = fstatSync(fd);
    // A FIFO, a device, a directory: not a token file (O_NONBLOCK kept the open from waiting on a FIFO).
    if (!st.isFile()) return { ok: false, reason: 'missing' };
    const read = parseToken(readAt(fd, st.size));
    if (held.size >= MAX_HELD_TOKEN_FILES) {
      const [oldest, o] = held.entries().next().value as [string, Held];
      release(oldest, o);
    }
    held.set(path, { fd, dev: st.dev, ino: st.ino, ctimeMs: st.ctimeMs });
    newest = path;
    startSweep();
    keep = true;
    return read;
  } catch {
    return { ok: false, reason: 'unreadable' };
  } finally {
    if (!keep) closeSync(fd);
  }
}

/**
 * The file's first READ_LIMIT bytes, read from offset 0. Stops once the size stat
 * reported has been read: saves the read(2) that would only say end-of-file. A file that
 * grew meanwhile is being rewritten in place; what was read is validated anyway.
 */
function readAt(fd: number, size: number): Buffer {
  const buf = readBuffer;
  let len = 0;
  const want = Math.min(READ_LIMIT, size === 0 ? READ_LIMIT : size);
  while (len < want) {
    const n = readSync(fd, buf, len, READ_LIMIT - len, len);
    if (n === 0) break;
    len += n;
  }
  return buf.subarray(0, len);
}

function openFailure(err: unknown): TokenFailure {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR' ? 'missing' : 'unreadable';
}

function release(path: string, h: Held): void {
  held.delete(path);
  if (newest === path) newest = undefined;
  try {
    closeSync(h.fd);
  } catch {
    // Already closed: nothing held.
  }
  if (held.size === 0) stopSweep();
}

const SWEEP_EVERY_MS = 1000;
let sweepTimer: NodeJS.Timeout | undefined;

function startSweep(): void {
  if (sweepTimer !== undefined) return;
  sweepTimer = setInterval(sweepUnlinked, SWEEP_EVERY_MS);
  // Never what keeps a process alive.
  sweepTimer.unref();
}

function stopSweep(): void {
  if (sweepTimer === undefined) return;
  clearInterval(sweepTimer);
  sweepTimer = undefined;
}

/**
 * Closes each held descriptor whose file was unlinked (no name left): one fstat per held
 * file (at most MAX_HELD_TOKEN_FILES). Exported for tests, which call it instead of
 * waiting for the timer.
 */
export function sweepUnlinked(): void {
  for (const [path, h] of [...held]) {
    let gone = true;
    try {
      gone = fstatSync(h.fd).nlink === 0;
    } catch {
      // A descriptor fstat cannot use holds nothing worth keeping.
    }
    if (gone) release(path, h);
  }
}

/** Closes every held descriptor (tests; a process that stops reading tokens). */
export function closeTokenFiles(): void {
  for (const [path, h] of [...held]) release(path, h);
}

/** How many token files are held open now (tests). */
export function heldTokenFiles(): number {
  return held.size;
}
