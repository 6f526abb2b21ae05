import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, lstatSync, mkdirSync, readFileSync, readlinkSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { copyTree, type EntryKind } from '../../src/fs/copy-tree.js';
import { tempDir } from '../support/temp-dir.js';

const mode = (p: string): number => statSync(p).mode & 0o7777;

t.test('files with their content and mode, folders with theirs, links as written; whatever the umask', async (t) => {
  const d = tempDir('ac-copytree-', t);
  const src = join(d, 'src');
  mkdirSync(join(src, 'bin'), { recursive: true });
  mkdirSync(join(src, 'private'));
  writeFileSync(join(src, 'bin', 'tool.js'), '#!/usr/bin/env node\n', { mode: 0o755 });
  writeFileSync(join(src, 'private', 'key'), 'k', { mode: 0o600 });
  writeFileSync(join(src, 'readme'), 'hello\n', { mode: 0o644 });
  chmodSync(join(src, 'private'), 0o700);
  symlinkSync('../bin/tool.js', join(src, 'private', 'relative-link'));
  symlinkSync('/nowhere/at/all', join(src, 'absolute-dangling'));
  // A read-only folder is still filled: its mode is set after its entries.
  mkdirSync(join(src, 'ro'));
  writeFileSync(join(src, 'ro', 'f'), 'f');
  chmodSync(join(src, 'ro'), 0o555);
  const umask = process.umask(0o077);
  try {
    await copyTree(src, join(d, 'dest'));
  } finally {
    process.umask(umask);
  }
  const dest = join(d, 'dest');
  t.equal(readFileSync(join(dest, 'readme'), 'utf8'), 'hello\n', 'content');
  t.equal(mode(join(dest, 'readme')), 0o644, 'a 0644 file stays 0644 under umask 077');
  t.equal(mode(join(dest, 'bin', 'tool.js')), 0o755, 'an executable stays executable');
  t.equal(mode(join(dest, 'private', 'key')), 0o600, 'a 0600 file stays 0600');
  t.equal(mode(join(dest, 'private')), 0o700, 'a folder keeps its mode');
  t.equal(mode(join(dest, 'bin')), mode(join(src, 'bin')), 'and so does every other');
  t.equal(mode(join(dest, 'ro')), 0o555, 'a read-only folder is read-only in the copy');
  t.equal(readFileSync(join(dest, 'ro', 'f'), 'utf8'), 'f', 'with its entries');
  t.ok(lstatSync(join(dest, 'private', 'relative-link')).isSymbolicLink(), 'a link is copied as a link');
  t.equal(readlinkSync(join(dest, 'private', 'relative-link')), '../bin/tool.js', 'relative, as written (fs.cp makes it absolute, into the source)');
  t.equal(readlinkSync(join(dest, 'absolute-dangling')), '/nowhere/at/all', 'a dangling link is copied, not followed');
  chmodSync(join(src, 'ro'), 0o755);
  chmodSync(join(dest, 'ro'), 0o755);
});

t.test('keep is asked for each entry by its relative path and kind; a folder it refuses is not read', async (t) => {
  const d = tempDir('ac-copytree-', t);
  const src = join(d, 'src');
  mkdirSync(join(src, 'a', 'skip', 'deep'), { recursive: true });
  writeFileSync(join(src, 'a', 'skip', 'deep', 'f'), '');
  writeFileSync(join(src, 'a', 'kept'), '');
  writeFileSync(join(src, 'a', 'dropped'), '');
  symlinkSync('kept', join(src, 'a', 'link'));
  const asked: Array<[string, EntryKind]> = [];
  await copyTree(src, join(d, 'dest'), async (rel, kind) => {
    asked.push([rel, kind]);
    return rel !== 'a/skip' && rel !== 'a/dropped';
  });
  t.same(
    asked.sort(([x], [y]) => x.localeCompare(y)),
    [
      ['a', 'dir'],
      ['a/dropped', 'file'],
      ['a/kept', 'file'],
      ['a/link', 'link'],
      ['a/skip', 'dir'],
    ],
    'every entry once, nothing under the refused folder',
  );
  t.ok(existsSync(join(d, 'dest', 'a', 'kept')), 'kept');
  t.notOk(existsSync(join(d, 'dest', 'a', 'dropped')), 'a refused file is not copied');
  t.notOk(existsSync(join(d, 'dest', 'a', 'skip')), 'nor a refused folder');
});

t.test('a FIFO is an error naming it; an existing destination file is not overwritten', async (t) => {
  const d = tempDir('ac-copytree-', t);
  mkdirSync(join(d, 'src'));
  execFileSync('mkfifo', [join(d, 'src', 'pipe')]);
  await t.rejects(copyTree(join(d, 'src'), join(d, 'dest')), { message: `${join(d, 'src', 'pipe')}: not a file, folder or symlink; nothing else is copied` });
  writeFileSync(join(d, 'file'), 'new');
  writeFileSync(join(d, 'there'), 'old');
  await t.rejects(copyTree(join(d, 'file'), join(d, 'there')), { code: 'EEXIST' });
  t.equal(readFileSync(join(d, 'there'), 'utf8'), 'old', 'untouched');
});
