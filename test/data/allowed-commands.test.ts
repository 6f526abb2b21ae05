import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { parseAllowedCommands, readAllowedCommands } from '../../src/data/allowed-commands.js';
import { ConfigError } from '../../src/errors.js';
import { tempDir } from '../support/temp-dir.js';

t.test('one name a line; comments and blank lines ignored; a bad line named by its number only', async (t) => {
  t.same(parseAllowedCommands('# mine\nnpm\n\n  python3  # the lab\n'), { ok: true, value: new Set(['npm', 'python3']) });
  t.same(parseAllowedCommands('npm\n../bin/sh\n'), { ok: false, error: 'line 2: must be one plain command name' });
  t.same(parseAllowedCommands('.profile\n'), { ok: false, error: 'line 1: must be one plain command name' });
  t.same(parseAllowedCommands(''), { ok: true, value: new Set() });
});

t.test('read: missing allows nothing; only a regular file root alone may write is used', { skip: process.getuid?.() !== 0 && 'needs root (chown)' }, async (t) => {
  const dir = tempDir('ac-allowed-', t);
  const file = join(dir, 'allowed-commands');
  t.same(await readAllowedCommands(file), new Set(), 'missing: nothing allowed');
  writeFileSync(file, 'npm\n', { mode: 0o644 });
  chmodSync(file, 0o644);
  t.same(await readAllowedCommands(file), new Set(['npm']));
  chmodSync(file, 0o664);
  await t.rejects(readAllowedCommands(file), ConfigError, 'group-writable: refused');
  chmodSync(file, 0o646);
  await t.rejects(readAllowedCommands(file), /owned by root and writable by root alone/, 'world-writable: refused');
  chmodSync(file, 0o644);
  chownSync(file, 65534, 0);
  await t.rejects(readAllowedCommands(file), /owned by root/, 'not root\'s: refused');
  const link = join(dir, 'link');
  symlinkSync(file, link);
  await t.rejects(readAllowedCommands(link), /symlink/, 'a symlink: refused');
  const fifo = join(dir, 'fifo');
  execFileSync('mkfifo', [fifo]);
  await t.rejects(readAllowedCommands(fifo), /not a regular file/, 'a FIFO: refused, not waited on');
});
