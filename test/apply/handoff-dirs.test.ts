import { lstatSync, mkdirSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { ensureHandoffDir } from '../../src/apply/handoff-dirs.js';
import { handoffPaths } from '../../src/data/handoff.js';
import { UnsafeDirError } from '../../src/fs/own-dir.js';
import { tempDir } from '../support/temp-dir.js';

t.test('a missing hand-off root is made sticky: the link group cannot rename apply\'s directories out of it', async (t) => {
  const paths = handoffPaths(join(tempDir('ac-handoff-dirs-', t), 'handoff'));
  await ensureHandoffDir(paths, 'rejected');
  t.equal(lstatSync(paths.root).mode & 0o1000, 0o1000, 'the root has the sticky bit');
  t.ok(lstatSync(paths.rejected).isDirectory(), 'rejected/ made');
});

t.test('a rejected/ planted as a symlink before apply made it is refused', async (t) => {
  const dir = tempDir('ac-handoff-dirs-', t);
  const paths = handoffPaths(join(dir, 'handoff'));
  mkdirSync(paths.root);
  mkdirSync(join(dir, 'shims'));
  symlinkSync(join(dir, 'shims'), paths.rejected);
  await t.rejects(ensureHandoffDir(paths, 'rejected'), UnsafeDirError);
});
