import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';

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

/**
 * Reads the token file afresh. Deliberately synchronous and uncached: the file is tiny and
 * local, a sync read costs a few microseconds, and it guarantees the request uses the token
 * that is on disk at this moment (renewal replaces it by rename at any time).
 */
export function readTokenFile(path: string): TokenRead {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return { ok: false, reason: code === 'ENOENT' || code === 'ENOTDIR' ? 'missing' : 'unreadable' };
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) return { ok: false, reason: 'missing' };
    const buf = readBuffer;
    let len = 0;
    // Stop once the size fstat reported has been read: saves the read(2) that would only
    // say end-of-file. A file that grew meanwhile was replaced in place, not by rename;
    // what was read is what the file held when it was opened (and is validated anyway).
    const want = Math.min(READ_LIMIT, st.size === 0 ? READ_LIMIT : st.size);
    while (len < want) {
      const n = readSync(fd, buf, len, READ_LIMIT - len, null);
      if (n === 0) break;
      len += n;
    }
    return parseToken(buf.subarray(0, len));
  } catch {
    return { ok: false, reason: 'unreadable' };
  } finally {
    closeSync(fd);
  }
}
