import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { watchDir } from '../../src/fs/dir-watch.js';
import type { TapTest } from '../support/tap.js';
import { eventually } from '../support/poll.js';
import { tempDir } from '../support/temp-dir.js';

/** Names reported so far, and a wait for one of them. */
function recorder(t: TapTest, dir: string): { seen: Array<string | undefined>; errors: string[]; arrives: (name: string) => Promise<boolean> } {
  const seen: Array<string | undefined> = [];
  const errors: string[] = [];
  const stop = watchDir(dir, (name) => seen.push(name), (err) => errors.push(err.message), { reappear: true });
  t.teardown(stop);
  return { seen, errors, arrives: (name) => eventually(() => seen.includes(name)) };
}

/** Writes the way atomicWrite does: a dot temp renamed into place. */
function renameInto(dir: string, name: string, text: string): void {
  writeFileSync(join(dir, `.${name}.tmp`), text);
  renameSync(join(dir, `.${name}.tmp`), join(dir, name));
}

t.test('reappear: the directory removed and made again is watched again', async (t) => {
  const dir = join(tempDir('ac-dir-watch-', t), 'mcp-forwarder');
  mkdirSync(dir);
  const r = recorder(t, dir);
  renameInto(dir, 'first.json', '1');
  t.ok(await r.arrives('first.json'), 'a file in the first directory is reported');

  rmSync(dir, { recursive: true });
  mkdirSync(dir);
  // The re-arm reports `undefined` (rescan) once it watches the new directory; a file
  // renamed in after that is named. Until then, what it missed is covered by the rescan.
  t.ok(await eventually(() => r.seen.lastIndexOf(undefined) > r.seen.indexOf('first.json')), 'the new directory is announced as a rescan');
  renameInto(dir, 'second.json', '2');
  t.ok(await r.arrives('second.json'), 'a file in the new directory is reported');
  t.notOk(r.seen.some((n) => n?.startsWith('.')), 'temps are not reported');
  t.same(r.errors, [], 'no error');
});

t.test('reappear: a directory missing at the start (its parent too) is watched once it exists', async (t) => {
  const root = tempDir('ac-dir-watch-', t);
  const dir = join(root, 'state', 'mcp-forwarder');
  const r = recorder(t, dir);
  t.same(r.errors, [], 'a missing directory is no error');
  mkdirSync(join(root, 'state'));
  mkdirSync(dir);
  t.ok(await eventually(() => r.seen.includes(undefined)), 'its appearance is announced as a rescan');
  renameInto(dir, 'instances.json', '{}');
  t.ok(await r.arrives('instances.json'), 'a file renamed into it is reported');
});

t.test('reappear: a dot directory (npm run dev\'s ./.state) is found too', async (t) => {
  const root = tempDir('ac-dir-watch-', t);
  const dir = join(root, '.state');
  const r = recorder(t, dir);
  mkdirSync(dir);
  t.ok(await eventually(() => r.seen.includes(undefined)), 'its appearance is announced');
  renameInto(dir, 'applied-state.json', '{}');
  t.ok(await r.arrives('applied-state.json'), 'and its files are reported');
});

t.test('without reappear, a missing directory is an error, as before', async (t) => {
  const errors: string[] = [];
  const stop = watchDir(join(tempDir('ac-dir-watch-', t), 'missing'), () => t.fail('no change expected'), (err) => errors.push(err.message));
  stop();
  t.match(errors, [/ENOENT/]);
});
