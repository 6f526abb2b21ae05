import { execFileSync } from 'node:child_process';
import { appendFileSync, mkdirSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { readBoundedRegularFile, UnsafeFileError } from '../../src/fs/bounded-read.js';
import { tempDir } from '../support/temp-dir.js';

const refusal = async (path: string, max: number): Promise<string> => {
  try {
    await readBoundedRegularFile(path, max);
  } catch (err) {
    if (err instanceof UnsafeFileError) return err.reason;
    throw err;
  }
  throw new Error(`${path} was read`);
};

t.test('a regular file within the bound is read whole, with its fstat', async (t) => {
  const d = tempDir('ac-bounded-', t);
  const f = join(d, 'a.json');
  writeFileSync(f, 'héllo');
  const r = await readBoundedRegularFile(f, 6);
  t.equal(r.text, 'héllo', 'exactly the bound (6 bytes) is allowed');
  t.ok(r.stat.isFile());
  const empty = join(d, 'empty');
  writeFileSync(empty, '');
  t.equal((await readBoundedRegularFile(empty, 10)).text, '');
});

t.test('one byte past the bound is refused', async (t) => {
  const d = tempDir('ac-bounded-', t);
  const f = join(d, 'big');
  writeFileSync(f, 'x'.repeat(11));
  t.equal(await refusal(f, 10), 'too-large');
  // A sparse 100 MB file: refused by fstat, nothing read.
  const huge = join(d, 'huge');
  writeFileSync(huge, '');
  truncateSync(huge, 100 * 1024 * 1024);
  t.equal(await refusal(huge, 8 * 1024 * 1024), 'too-large');
});

t.test('a symlink is not followed, whatever it points at', async (t) => {
  const d = tempDir('ac-bounded-', t);
  const target = join(d, 'target');
  writeFileSync(target, 'secret');
  symlinkSync(target, join(d, 'to-file'));
  symlinkSync('/dev/zero', join(d, 'to-zero'));
  t.equal(await refusal(join(d, 'to-file'), 100), 'symlink');
  t.equal(await refusal(join(d, 'to-zero'), 100), 'symlink');
});

t.test('a FIFO, a device and a directory are refused at once, never waited on', async (t) => {
  const d = tempDir('ac-bounded-', t);
  const fifo = join(d, 'fifo');
  execFileSync('mkfifo', [fifo]);
  // Without O_NONBLOCK this open would wait for a writer forever and the test time out.
  t.equal(await refusal(fifo, 100), 'not-regular');
  t.equal(await refusal('/dev/zero', 100), 'not-regular');
  mkdirSync(join(d, 'dir'));
  t.equal(await refusal(join(d, 'dir'), 100), 'not-regular');
});

t.test('a missing file throws ENOENT as it is', async (t) => {
  const d = tempDir('ac-bounded-', t);
  await t.rejects(readBoundedRegularFile(join(d, 'nope'), 10), { code: 'ENOENT' });
});

t.test('the message names the rule, never the content', async (t) => {
  const d = tempDir('ac-bounded-', t);
  const f = join(d, 'f');
  writeFileSync(f, 'tok-secret-value');
  appendFileSync(f, 'x'.repeat(100));
  const err = await readBoundedRegularFile(f, 10).catch((e: unknown) => e);
  t.ok(err instanceof UnsafeFileError);
  t.notMatch((err as Error).message, /tok-secret/);
  t.match((err as Error).message, /larger than 10 bytes/);
});

t.test('the same answers whether the bound is read in synchronous calls (small) or off the event loop (large)', async (t) => {
  const { SYNC_READ_MAX_BYTES } = await import('../../src/fs/bounded-read.js');
  const d = tempDir('ac-bounded-', t);
  const fifo = join(d, 'fifo');
  execFileSync('mkfifo', [fifo]);
  symlinkSync('/dev/zero', join(d, 'to-zero'));
  for (const max of [SYNC_READ_MAX_BYTES, SYNC_READ_MAX_BYTES + 1]) {
    const exact = join(d, `exact-${max}`);
    writeFileSync(exact, `${'é'.repeat(Math.floor(max / 2) - 1)}${'x'.repeat(2 + (max % 2))}`);
    t.equal(Buffer.byteLength((await readBoundedRegularFile(exact, max)).text), max, `${max}: exactly the bound is read whole`);
    appendFileSync(exact, 'x');
    t.equal(await refusal(exact, max), 'too-large', `${max}: one byte more is refused`);
    t.equal(await refusal(fifo, max), 'not-regular', `${max}: a FIFO is refused at once`);
    t.equal(await refusal(join(d, 'to-zero'), max), 'symlink', `${max}: a symlink is not followed`);
  }
});
