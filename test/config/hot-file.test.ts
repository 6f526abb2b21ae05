import { mkdirSync, renameSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import t from 'tap';
import { HotFile, type HotState } from '../../src/config/hot-file.js';
import { parseInstancesFile, type Binding, type InstancesFile } from '../../src/data/registry.js';
import type { TapTest } from '../support/tap.js';
import { eventually } from '../support/poll.js';
import { tempDir } from '../support/temp-dir.js';

const dir = (): string => tempDir('ac-hot-', t);

function binding(instanceId: string): Binding {
  return { instanceId, upstreamUrl: 'https://gateway.example.com/mcp', tokenFile: `/tmp/${instanceId}.token` };
}

function registryText(ids: string[]): string {
  return JSON.stringify(Object.fromEntries(ids.map((id) => [id, binding(`inst-${id.slice(-2)}`)])));
}

/** Writes the way bind and renewal do: a temp file renamed into place. */
function renameInto(path: string, text: string): void {
  const tmp = `${path}.tmp-${Math.random().toString(36).slice(2)}`;
  writeFileSync(tmp, text, { mode: 0o600 });
  renameSync(tmp, path);
}

function hot(t: TapTest, path: string, onLoad?: (s: HotState<InstancesFile>) => void): HotFile<InstancesFile> {
  const h = new HotFile<InstancesFile>({
    path,
    parse: parseInstancesFile,
    empty: {},
    ...(onLoad ? { onLoad: (s: HotState<InstancesFile>) => onLoad(s) } : {}),
  });
  t.teardown(() => h.close());
  return h;
}

const ID1 = 'binding_hot_0001';
const ID2 = 'binding_hot_0002';

t.test('a missing file is an empty, healthy registry', async (t) => {
  const d = dir();
  const h = hot(t, join(d, 'instances.json'));
  await h.start();
  t.strictSame(h.current.value, {});
  t.equal(h.current.status, 'ok');
  t.equal(h.current.error, undefined);
});

t.test('a missing directory is an empty registry too', async (t) => {
  const d = dir();
  const h = hot(t, join(d, 'not-yet', 'instances.json'));
  await h.reload();
  t.strictSame(h.current.value, {});
  t.equal(h.current.status, 'ok');
});

t.test('a good file loads its value', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  writeFileSync(p, registryText([ID1, ID2]));
  const h = hot(t, p);
  await h.start();
  t.strictSame(Object.keys(h.current.value).sort(), [ID1, ID2]);
  t.same(h.current.value[ID1], binding('inst-01'));
  t.equal(h.current.status, 'ok');
});

t.test('a bad file keeps the last good value and turns degraded until a good one loads', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  writeFileSync(p, registryText([ID1]));
  const h = hot(t, p);
  await h.reload();
  t.strictSame(Object.keys(h.current.value), [ID1]);

  const badTexts = [
    '{"binding_hot_0001": ',
    JSON.stringify({ [ID1]: { ...binding('x'), upstreamUrl: 'http://gateway.example.com/' } }),
    JSON.stringify({ short: binding('x') }),
    '[]',
  ];
  for (const bad of badTexts) {
    writeFileSync(p, bad);
    await h.reload();
    t.equal(h.current.status, 'degraded', `degraded after ${bad.slice(0, 30)}`);
    t.strictSame(Object.keys(h.current.value), [ID1], 'last good value stays in force');
    t.type(h.current.error, 'string');
    t.ok((h.current.error ?? '').length > 0, 'error set');
    t.notMatch(h.current.error ?? '', ID1, 'error does not contain the full binding id');
  }

  writeFileSync(p, registryText([ID2]));
  await h.reload();
  t.equal(h.current.status, 'ok', 'good file: ok again');
  t.equal(h.current.error, undefined, 'error cleared');
  t.strictSame(Object.keys(h.current.value), [ID2]);
});

t.test('a bad file at startup: degraded with the empty value', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  writeFileSync(p, '{ not json');
  const h = hot(t, p);
  await h.start();
  t.equal(h.current.status, 'degraded');
  t.strictSame(h.current.value, {});
});

t.test('onLoad reports good and bad loads', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  const seen: Array<{ status: string; n: number }> = [];
  const h = hot(t, p, (s) => seen.push({ status: s.status, n: Object.keys(s.value).length }));
  await h.reload();
  writeFileSync(p, registryText([ID1]));
  await h.reload();
  writeFileSync(p, 'garbage');
  await h.reload();
  t.strictSame(seen, [
    { status: 'ok', n: 0 },
    { status: 'ok', n: 1 },
    { status: 'degraded', n: 1 },
  ]);
});

t.test('watching: rename into place, bad file, removal', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  const h = hot(t, p);
  await h.start();
  t.strictSame(h.current.value, {});

  renameInto(p, registryText([ID1]));
  t.ok(await eventually(() => ID1 in h.current.value), 'a file renamed into place is loaded without reload()');
  t.equal(h.current.status, 'ok');

  renameInto(p, registryText([ID1, ID2]));
  t.ok(await eventually(() => ID2 in h.current.value), 'a replacement is loaded');

  renameInto(p, '{"oops"');
  t.ok(await eventually(() => h.current.status === 'degraded'), 'an invalid replacement turns degraded');
  t.strictSame(Object.keys(h.current.value).sort(), [ID1, ID2], 'last good value stays');

  renameInto(p, registryText([ID2]));
  t.ok(await eventually(() => h.current.status === 'ok' && !(ID1 in h.current.value)), 'recovers, removed binding gone');

  writeFileSync(p, registryText([ID1]));
  t.ok(await eventually(() => ID1 in h.current.value && !(ID2 in h.current.value)), 'an in-place write is loaded too');

  unlinkSync(p);
  t.ok(await eventually(() => Object.keys(h.current.value).length === 0), 'a removed file is an empty registry');
  t.equal(h.current.status, 'ok');

  renameInto(p, registryText([ID2]));
  t.ok(await eventually(() => ID2 in h.current.value), 'a file that reappears is loaded');
});

t.test('a burst of replacements (e.g. concurrent binds): the last one is loaded', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  const h = hot(t, p);
  await h.start();
  // Renames a few ms apart, as a loop of binds or several binds racing for the lock make.
  for (const gapMs of [0, 5, 10, 20, 40]) {
    const ids: string[] = [];
    for (let i = 0; i < 12; i++) {
      ids.push(`burst_${gapMs}_binding_${String(i).padStart(2, '0')}`);
      renameInto(p, registryText(ids));
      if (gapMs > 0) await sleep(gapMs);
    }
    const last = ids.at(-1) as string;
    t.ok(
      await eventually(() => last in h.current.value && Object.keys(h.current.value).length === ids.length, 5_000),
      `gap ${gapMs} ms: the final file (${ids.length} bindings) is in force, got ${Object.keys(h.current.value).length}`,
    );
  }
});

t.test('other files in the directory do not disturb the value', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  writeFileSync(p, registryText([ID1]));
  const h = hot(t, p);
  await h.start();
  renameInto(join(d, 'other.json'), 'garbage');
  writeFileSync(join(d, 'inst-01.token'), 'tok\n');
  // Sync point: a later change to our file is seen, so the earlier events were processed.
  renameInto(p, registryText([ID1, ID2]));
  t.ok(await eventually(() => ID2 in h.current.value));
  t.equal(h.current.status, 'ok');
});

t.test('reload() re-resolves a symlink that changed', async (t) => {
  const d = dir();
  mkdirSync(join(d, 'a'));
  mkdirSync(join(d, 'b'));
  writeFileSync(join(d, 'a', 'instances.json'), registryText([ID1]));
  writeFileSync(join(d, 'b', 'instances.json'), registryText([ID2]));
  const p = join(d, 'instances.json');
  symlinkSync(join(d, 'a', 'instances.json'), p);
  const h = hot(t, p);
  await h.start();
  t.strictSame(Object.keys(h.current.value), [ID1]);
  // Re-point the link atomically (ln -sfn style).
  symlinkSync(join(d, 'b', 'instances.json'), `${p}.new`);
  renameSync(`${p}.new`, p);
  await h.reload();
  t.strictSame(Object.keys(h.current.value), [ID2], 'the new link target is read');
});

t.test('reload() re-resolves a symlinked directory that changed, and the watch moves there', async (t) => {
  const d = dir();
  mkdirSync(join(d, 'gen1'));
  mkdirSync(join(d, 'gen2'));
  writeFileSync(join(d, 'gen1', 'instances.json'), registryText([ID1]));
  writeFileSync(join(d, 'gen2', 'instances.json'), registryText([ID2]));
  symlinkSync(join(d, 'gen1'), join(d, 'current'));
  const h = hot(t, join(d, 'current', 'instances.json'));
  await h.start();
  t.strictSame(Object.keys(h.current.value), [ID1]);
  symlinkSync(join(d, 'gen2'), join(d, 'current.new'));
  renameSync(join(d, 'current.new'), join(d, 'current'));
  await h.reload();
  t.strictSame(Object.keys(h.current.value), [ID2]);
  renameInto(join(d, 'gen2', 'instances.json'), registryText([ID1, ID2]));
  t.ok(await eventually(() => ID1 in h.current.value && ID2 in h.current.value), 'a replacement in the new directory is loaded without reload()');
});

t.test('close() stops watching', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  writeFileSync(p, registryText([ID1]));
  const closed = hot(t, p);
  await closed.start();
  const control = hot(t, p);
  await control.start();
  await closed.close();
  const generation = closed.current.generation;

  renameInto(p, registryText([ID2]));
  // The control watcher on the same file proves the change was observable.
  t.ok(await eventually(() => ID2 in control.current.value), 'an open watcher sees the change');
  // Give the closed one as long again as the control needed, plus its debounce.
  await sleep(300);
  t.strictSame(Object.keys(closed.current.value), [ID1], 'a closed HotFile keeps its value');
  t.equal(closed.current.generation, generation, 'and never reloaded');
  await t.resolves(closed.close(), 'close() twice is harmless');
});

t.test('the registry replaced by rename 50 times in a row: every replacement is seen and the last wins', async (t) => {
  const d = dir();
  const p = join(d, 'instances.json');
  const loads: number[] = [];
  const h = hot(t, p, (s) => loads.push(Object.keys(s.value).length));
  await h.start();
  const ids: string[] = [];
  for (let i = 0; i < 50; i++) {
    ids.push(`row_binding_${String(i).padStart(4, '0')}`);
    renameInto(p, registryText(ids));
  }
  t.ok(await eventually(() => Object.keys(h.current.value).length === 50 && ids.every((id) => id in h.current.value)), 'the 50th version is in force');
  t.equal(h.current.status, 'ok');
  t.ok(loads.every((n, i) => i === 0 || n >= (loads[i - 1] ?? 0)), 'no load went back to an older version');
});

t.test('the watched directory removed and made again: the file in the new directory is loaded', async (t) => {
  const root = dir();
  const d = join(root, 'mcp-forwarder');
  mkdirSync(d);
  const p = join(d, 'instances.json');
  renameInto(p, registryText([ID1]));
  const h = hot(t, p);
  await h.start();
  t.ok(ID1 in h.current.value);

  rmSync(d, { recursive: true });
  t.ok(await eventually(() => Object.keys(h.current.value).length === 0), 'the removed file is an empty registry');
  mkdirSync(d);
  renameInto(p, registryText([ID2]));
  t.ok(await eventually(() => ID2 in h.current.value), 'the file in the re-made directory is loaded without reload()');
  renameInto(p, registryText([ID1, ID2]));
  t.ok(await eventually(() => ID1 in h.current.value && ID2 in h.current.value), 'and its next replacement too');
});

t.test('a directory missing at start: its file is loaded once both appear', async (t) => {
  const root = dir();
  const p = join(root, 'not-yet', 'instances.json');
  const h = hot(t, p);
  await h.start();
  t.strictSame(h.current.value, {});
  mkdirSync(join(root, 'not-yet'));
  renameInto(p, registryText([ID1]));
  t.ok(await eventually(() => ID1 in h.current.value), 'loaded without reload()');
});

t.test('a file that is a symlink into another directory: a replacement of its target is loaded, and so is a re-pointed link', async (t) => {
  const d = dir();
  for (const sub of ['etc', 'gen1', 'gen2']) mkdirSync(join(d, sub));
  renameInto(join(d, 'gen1', 'instances.json'), registryText([ID1]));
  renameInto(join(d, 'gen2', 'instances.json'), registryText([ID2]));
  const p = join(d, 'etc', 'instances.json');
  symlinkSync(join(d, 'gen1', 'instances.json'), p);
  const h = hot(t, p);
  await h.start();
  t.strictSame(Object.keys(h.current.value), [ID1]);

  renameInto(join(d, 'gen1', 'instances.json'), registryText([ID1, ID2]));
  t.ok(await eventually(() => ID2 in h.current.value), "the target's replacement, in its own directory, is loaded");

  symlinkSync(join(d, 'gen2', 'instances.json'), `${p}.new`);
  renameSync(`${p}.new`, p);
  t.ok(await eventually(() => !(ID1 in h.current.value)), 'the re-pointed link is loaded');
  renameInto(join(d, 'gen2', 'instances.json'), registryText([ID1]));
  t.ok(await eventually(() => ID1 in h.current.value && !(ID2 in h.current.value)), "and then its new target's directory is watched");
});
