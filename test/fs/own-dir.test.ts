import { chownSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { ensureOwnDir, UnsafeDirError, verifyOwnDir } from '../../src/fs/own-dir.js';
import { tempDir } from '../support/temp-dir.js';

const me = new Set([process.geteuid?.() ?? 0]);

const refusal = async (p: Promise<unknown>): Promise<string> => {
  try {
    await p;
  } catch (err) {
    if (err instanceof UnsafeDirError) return err.reason;
    throw err;
  }
  throw new Error('accepted');
};

t.test('ensureOwnDir creates a missing directory with the mode, and accepts an existing own one', async (t) => {
  const d = tempDir('ac-owndir-', t);
  const st = await ensureOwnDir(join(d, 'rejected'), me, 0o700);
  t.ok(st.isDirectory());
  t.equal(st.mode & 0o777, 0o700);
  t.ok(await ensureOwnDir(join(d, 'rejected'), me, 0o700), 'again: accepted');
});

t.test('a symlink to a directory is refused, not followed, not replaced', async (t) => {
  const d = tempDir('ac-owndir-', t);
  const elsewhere = join(d, 'shims');
  mkdirSync(elsewhere);
  symlinkSync(elsewhere, join(d, 'rejected'));
  t.equal(await refusal(ensureOwnDir(join(d, 'rejected'), me, 0o700)), 'symlink');
  t.equal(await refusal(verifyOwnDir(join(d, 'rejected'), me)), 'symlink');
  // A dangling link too: mkdir must not create its target.
  symlinkSync(join(d, 'made-through-link'), join(d, 'dangling'));
  t.equal(await refusal(ensureOwnDir(join(d, 'dangling'), me, 0o700)), 'symlink');
});

t.test('a file in place of the directory is refused', async (t) => {
  const d = tempDir('ac-owndir-', t);
  writeFileSync(join(d, 'inbox'), '');
  t.equal(await refusal(ensureOwnDir(join(d, 'inbox'), me, 0o700)), 'not-directory');
});

t.test("a directory owned by another UID (the link's) is refused", { skip: process.geteuid?.() !== 0 ? 'needs root to chown' : false }, async (t) => {
  const d = tempDir('ac-owndir-', t);
  const planted = join(d, 'rejected');
  mkdirSync(planted);
  chownSync(planted, 65534, 65534);
  t.equal(await refusal(verifyOwnDir(planted, new Set([0]))), 'owner');
  t.ok(await verifyOwnDir(planted, new Set([0, 65534])), 'accepted when its owner is trusted');
});
