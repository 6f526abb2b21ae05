import { closeSync, constants, fstatSync, openSync, readSync, type Stats } from 'node:fs';
import { open } from 'node:fs/promises';

/**
 * Why a file was refused without being read. `symlink`: the last component is a link
 * (O_NOFOLLOW); `not-regular`: a FIFO, device, socket or directory; `too-large`: more
 * than the bound (by fstat, or grown past it while read).
 */
export type UnsafeFileReason = 'symlink' | 'not-regular' | 'too-large';

/** A file refused by `readBoundedRegularFile`. The message names the rule, never the content. */
export class UnsafeFileError extends Error {
  constructor(
    readonly path: string,
    readonly reason: UnsafeFileReason,
    maxBytes: number,
  ) {
    super(
      reason === 'symlink'
        ? `${path} is a symlink (not followed)`
        : reason === 'not-regular'
          ? `${path} is not a regular file`
          : `${path} is larger than ${maxBytes} bytes`,
    );
    this.name = 'UnsafeFileError';
  }
}

export interface BoundedFile {
  text: string;
  /** fstat of the file read: its inode tells it from a file renamed over it later. */
  stat: Stats;
}

/**
 * Reads a file another, less trusted, process may have put there (the hand-off): never
 * through a symlink, never blocking on a FIFO or a device, never more than `maxBytes`.
 * O_NOFOLLOW makes a link fail the open (ELOOP); O_NONBLOCK makes opening a FIFO return at
 * once instead of waiting for a writer (which held apply's lock forever); fstat on the
 * opened descriptor, not a stat of the path, so what is checked is what is read. At most
 * `maxBytes + 1` bytes are read: a file that grows after the fstat is still refused
 * without being read whole. ENOENT and other open errors are thrown as they are.
 */
export async function readBoundedRegularFile(path: string, maxBytes: number): Promise<BoundedFile> {
  if (maxBytes <= SYNC_READ_MAX_BYTES) return readBoundedRegularFileSync(path, maxBytes);
  let fh;
  try {
    fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ELOOP') throw new UnsafeFileError(path, 'symlink', maxBytes);
    throw err;
  }
  try {
    const stat = await fh.stat();
    if (!stat.isFile()) throw new UnsafeFileError(path, 'not-regular', maxBytes);
    if (stat.size > maxBytes) throw new UnsafeFileError(path, 'too-large', maxBytes);
    // Sized by fstat, then read to EOF: a file that grew since is read on, up to the bound.
    const chunks: Buffer[] = [];
    let length = 0;
    let chunk = Buffer.alloc(Math.min(stat.size, maxBytes) + 1);
    for (;;) {
      const { bytesRead } = await fh.read(chunk, 0, chunk.length, length);
      if (bytesRead === 0) break;
      chunks.push(chunk.subarray(0, bytesRead));
      length += bytesRead;
      if (length > maxBytes) throw new UnsafeFileError(path, 'too-large', maxBytes);
      // The rest of this buffer, or a new one once it is full (never over what was kept).
      chunk = bytesRead < chunk.length ? chunk.subarray(bytesRead) : Buffer.alloc(Math.min(64 * 1024, maxBytes + 1 - length));
    }
    const text = Buffer.concat(chunks, length).toString('utf8');
    return { text, stat };
  } finally {
    await fh.close();
  }
}

/**
 * Up to this bound the read is made of synchronous calls: for a file of a few hundred bytes
 * (a slot file, an inbox file) each of the four awaited steps cost about five times the
 * CPU of its system call (a hop to libuv's pool and back), and apply and the link read one
 * such file per renewed slot. Nothing here can block for long: O_NONBLOCK, and at most
 * this many bytes read. A larger bound (a desired state) stays off the event loop.
 */
export const SYNC_READ_MAX_BYTES = 64 * 1024;

/** `readBoundedRegularFile` in synchronous calls (the same checks, in the same order). */
export function readBoundedRegularFileSync(path: string, maxBytes: number): BoundedFile {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ELOOP') throw new UnsafeFileError(path, 'symlink', maxBytes);
    throw err;
  }
  try {
    const stat = fstatSync(fd);
    if (!stat.isFile()) throw new UnsafeFileError(path, 'not-regular', maxBytes);
    if (stat.size > maxBytes) throw new UnsafeFileError(path, 'too-large', maxBytes);
    // Sized by fstat plus one byte; a file that grew since fills it and is read on, into
    // one buffer of the bound plus one byte (so a file grown past the bound is refused).
    let buf = Buffer.allocUnsafe(stat.size + 1);
    let length = 0;
    for (let n; (n = readSync(fd, buf, length, buf.length - length, length)) > 0; ) {
      length += n;
      if (length > maxBytes) throw new UnsafeFileError(path, 'too-large', maxBytes);
      // A short read of a regular file is its end: no second call to be told so (a file
      // that grows after it is read as it was then, as it would be after that call).
      if (length < buf.length) break;
      buf = Buffer.concat([buf], maxBytes + 1);
    }
    return { text: buf.toString('utf8', 0, length), stat };
  } finally {
    closeSync(fd);
  }
}

/** `readBoundedRegularFile`'s text, or undefined when the file does not exist. */
export async function readBoundedText(path: string, maxBytes: number): Promise<string | undefined> {
  try {
    return (await readBoundedRegularFile(path, maxBytes)).text;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}
