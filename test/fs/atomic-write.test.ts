import { lstatSync, mkdirSync, readFileSync, readdirSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import t from 'tap';
import { atomicWrite, atomicWriteSync } from '../../src/fs/atomic-write.js';
import { tempDir } from '../support/temp-dir.js';

const dir = (): string => tempDir('ac-atomic-', t);

function modeOf(path: string): number {
  return statSync(path).mode & 0o777;
}

async function withUmask<T>(mask: number, fn: () => Promise<T>): Promise<T> {
  const old = process.umask(mask);
  try {
    return await fn();
  } finally {
    process.umask(old);
  }
}

t.test('binary data is written byte for byte', async (t) => {
  const d = dir();
  const f = join(d, 'bin');
  const data = new Uint8Array([0, 1, 2, 255, 10, 13, 0]);
  await atomicWrite(f, data);
  t.ok(readFileSync(f).equals(Buffer.from(data)));
});

t.test('returns the written file\'s stat: the same inode, size and mtime the target then has', async (t) => {
  const f = join(dir(), 'f');
  const written = await atomicWrite(f, 'hello\n');
  const st = statSync(f);
  t.same([written.ino, written.size, written.mtimeMs], [st.ino, st.size, st.mtimeMs]);
});

/** Both writers keep the same promises to a reader; only durability and blocking differ. */
const WRITERS: Array<[string, (path: string, data: string, options?: { mode?: number }) => Promise<unknown>]> = [
  ['atomicWrite', atomicWrite],
  ['atomicWriteSync', async (path, data, options) => atomicWriteSync(path, data, options)],
];

for (const [name, write] of WRITERS) {
  t.test(`writes the content with the given mode, whatever the umask (${name})`, async (t) => {
    const d = dir();
    for (const umask of [0o022, 0o077, 0o000]) {
      for (const mode of [0o600, 0o640, 0o644, 0o660]) {
        const f = join(d, `f-${umask.toString(8)}-${mode.toString(8)}.json`);
        await withUmask(umask, () => write(f, `content ${mode}`, { mode }));
        t.equal(readFileSync(f, 'utf8'), `content ${mode}`);
        t.equal(modeOf(f), mode, `umask ${umask.toString(8)} mode ${mode.toString(8)}`);
      }
    }
  });

  t.test(`defaults to 0600 (${name})`, async (t) => {
    const d = dir();
    const f = join(d, 'default.json');
    await withUmask(0o000, () => write(f, 'x'));
    t.equal(modeOf(f), 0o600);
  });

  t.test(`replaces an existing file (new inode, new mode), leaves no temp files (${name})`, async (t) => {
    const d = dir();
    const f = join(d, 'instances.json');
    writeFileSync(f, 'old content that is longer than the new one', { mode: 0o644 });
    const before = statSync(f).ino;
    await write(f, 'new', { mode: 0o600 });
    t.equal(readFileSync(f, 'utf8'), 'new');
    t.equal(modeOf(f), 0o600);
    t.not(statSync(f).ino, before, 'replaced by rename, not rewritten in place');
    for (let i = 0; i < 20; i++) await write(f, `v${i}`);
    t.equal(readFileSync(f, 'utf8'), 'v19');
    t.strictSame(readdirSync(d), ['instances.json'], 'no temp files left behind');
  });

  t.test(`refuses a symlink at the target; the link and its target stay untouched (${name})`, async (t) => {
    const d = dir();
    const real = join(d, 'real.token');
    const link = join(d, 'link.token');
    writeFileSync(real, 'original', { mode: 0o600 });
    symlinkSync(real, link);
    await t.rejects(write(link, 'replaced'));
    t.ok(lstatSync(link).isSymbolicLink(), 'the link is still a link');
    t.equal(readFileSync(real, 'utf8'), 'original', 'the link target is untouched');
    t.strictSame(readdirSync(d).sort(), ['link.token', 'real.token'], 'no temp files left behind');
  });

  t.test(`refuses a dangling symlink at the target (does not create its target) (${name})`, async (t) => {
    const d = dir();
    const link = join(d, 'dangling');
    symlinkSync(join(d, 'would-be-created'), link);
    await t.rejects(write(link, 'x'));
    t.ok(lstatSync(link).isSymbolicLink());
    t.strictSame(readdirSync(d), ['dangling']);
  });

  t.test(`refuses a directory at the target (${name})`, async (t) => {
    const d = dir();
    const target = join(d, 'a-dir');
    mkdirSync(target);
    writeFileSync(join(target, 'inside'), 'keep');
    await t.rejects(write(target, 'x'));
    t.ok(statSync(target).isDirectory());
    t.equal(readFileSync(join(target, 'inside'), 'utf8'), 'keep');
    t.strictSame(readdirSync(d), ['a-dir']);
  });

  t.test(`fails cleanly when the directory does not exist (${name})`, async (t) => {
    const d = dir();
    await t.rejects(write(join(d, 'missing', 'f'), 'x'));
    t.strictSame(readdirSync(d), []);
  });
}

t.test('atomicWriteSync: halfway through, only a temp file holds the data; it becomes the file whole', async (t) => {
  const d = dir();
  const f = join(d, 'event.json');
  const seen: string[][] = [];
  atomicWriteSync(f, 'A'.repeat(64), { mode: 0o640, midWrite: () => seen.push(readdirSync(d)) });
  t.equal(seen.length, 1, 'the hook ran once');
  t.notOk(seen[0]?.includes('event.json'), 'the target did not exist mid-write');
  t.match(seen[0]?.[0] ?? '', /^\.event\.json\.\d+\.[0-9a-f]{12}\.tmp$/, "a temp file named like atomicWrite's (so sweepStaleTemps finds it)");
  t.equal(readFileSync(f, 'utf8'), 'A'.repeat(64));
  t.strictSame(readdirSync(d), ['event.json']);
});

// A reader thread reads the file in a tight loop and classifies every read.
const READER = `
const { workerData, parentPort } = require('node:worker_threads');
const { readFileSync } = require('node:fs');
const flag = new Int32Array(workerData.stop);
const counts = { a: 0, b: 0, bad: 0, errors: 0, badSample: '' };
while (Atomics.load(flag, 0) === 0) {
  let buf;
  try { buf = readFileSync(workerData.path); } catch (e) { counts.errors++; counts.badSample = String(e.code); continue; }
  if (buf.length === workerData.lenA && buf[0] === 0x41 && buf[buf.length - 1] === 0x41 && buf.indexOf(0x42) === -1) counts.a++;
  else if (buf.length === workerData.lenB && buf[0] === 0x42 && buf[buf.length - 1] === 0x42 && buf.indexOf(0x41) === -1) counts.b++;
  else { counts.bad++; counts.badSample = 'len=' + buf.length; }
}
parentPort.postMessage(counts);
`;

interface ReaderCounts {
  a: number;
  b: number;
  bad: number;
  errors: number;
  badSample: string;
}

t.test('a concurrent reader never sees a partial file', async (t) => {
  const d = dir();
  const f = join(d, 'big.json');
  const A = Buffer.alloc(1024 * 1024, 'A');
  const B = Buffer.alloc(1024 * 1024 + 4099, 'B');
  await atomicWrite(f, A);
  const stop = new SharedArrayBuffer(4);
  const worker = new Worker(READER, { eval: true, workerData: { path: f, stop, lenA: A.length, lenB: B.length } });
  const result = new Promise<ReaderCounts>((resolve, reject) => {
    worker.once('message', (m: ReaderCounts) => resolve(m));
    worker.once('error', reject);
  });
  await new Promise<void>((resolve) => worker.once('online', () => resolve()));
  for (let i = 0; i < 200; i++) await atomicWrite(f, i % 2 === 0 ? B : A);
  Atomics.store(new Int32Array(stop), 0, 1);
  const counts = await result;
  await worker.terminate();
  t.equal(counts.bad, 0, `no partial or mixed read (${counts.badSample})`);
  t.equal(counts.errors, 0, `no failed read (${counts.badSample})`);
  t.ok(counts.a + counts.b > 0, `reader ran (${counts.a} A, ${counts.b} B)`);
  t.ok(counts.a > 0 && counts.b > 0, `reader saw both versions (${counts.a} A, ${counts.b} B)`);
  t.ok(readFileSync(f).equals(A), 'last write wins');
  t.strictSame(readdirSync(d), ['big.json'], 'no temp files left behind');
});
