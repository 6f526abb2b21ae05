import { mkdirSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import t from 'tap';
import { localConfigFiles } from '../../src/apply/local-config.js';
import { tokenTargets } from '../../src/apply/token-targets.js';
import { stateLayout, type StateLayout } from '../../src/data/state-layout.js';
import { tempDir } from '../support/temp-dir.js';

/** Fresh token targets over a fresh state root, as apply builds them at start. */
function targets(): { layout: StateLayout; tokenFilesFor: (slot: string) => Promise<string[]> } {
  const layout = stateLayout(join(tempDir('ac-targets-', t), 'state'));
  return { layout, tokenFilesFor: tokenTargets(localConfigFiles(layout), layout) };
}

/** Written by rename, as `bind` and an editor that saves atomically do. */
function replace(path: string, content: unknown): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(`${path}.tmp`, typeof content === 'string' ? content : JSON.stringify(content, null, 2), { mode: 0o600 });
  renameSync(`${path}.tmp`, path);
}

const binding = (instanceId: string, tokenFile: string): { instanceId: string; upstreamUrl: string; tokenFile: string } => ({
  instanceId,
  upstreamUrl: 'https://gw.example/mcp',
  tokenFile,
});

const notion = (tokenFile: string): Record<string, unknown> => ({
  notion: {
    upstream: 'https://api.notion.com',
    tokenFile,
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    commands: [{ name: 'ntn', env: { NOTION_TOKEN: '{placeholder}' } }],
  },
});

t.test('instance slots: no binding → the §2 default path', async (t) => {
  const c = targets();
  const want = [join(c.layout.forwarderDir, 'inst-1.token')];
  t.strictSame(await c.tokenFilesFor('instance:inst-1'), want, 'no instances.json');
  replace(c.layout.instances, { bindingAAAAAAAA: binding('other', '/srv/other.token') });
  t.strictSame(await c.tokenFilesFor('instance:inst-1'), want, 'only other instances bound');
});

t.test('instance slots: one binding → its tokenFile', async (t) => {
  const c = targets();
  replace(c.layout.instances, {
    bindingAAAAAAAA: binding('inst-1', '/srv/tokens/one.token'),
    bindingBBBBBBBB: binding('other', '/srv/tokens/other.token'),
  });
  t.strictSame(await c.tokenFilesFor('instance:inst-1'), ['/srv/tokens/one.token']);
});

t.test('instance slots: two bindings → both distinct files, or one when shared', async (t) => {
  const c = targets();
  replace(c.layout.instances, {
    bindingAAAAAAAA: binding('inst-1', '/srv/tokens/a.token'),
    bindingBBBBBBBB: binding('inst-1', '/srv/tokens/b.token'),
  });
  t.strictSame((await c.tokenFilesFor('instance:inst-1')).sort(), ['/srv/tokens/a.token', '/srv/tokens/b.token']);
  replace(c.layout.instances, {
    bindingAAAAAAAA: binding('inst-1', '/srv/tokens/a.token'),
    bindingBBBBBBBB: binding('inst-1', '/srv/tokens/a.token'),
  });
  t.strictSame(await c.tokenFilesFor('instance:inst-1'), ['/srv/tokens/a.token'], 'shared file listed once');
});

t.test('an operator-managed host: a binding added or removed by hand is seen at the next token', async (t) => {
  const c = targets();
  replace(c.layout.instances, { bindingAAAAAAAA: binding('inst-1', '/srv/tokens/a.token') });
  t.strictSame(await c.tokenFilesFor('instance:inst-1'), ['/srv/tokens/a.token']);
  replace(c.layout.instances, { bindingAAAAAAAA: binding('inst-1', '/srv/tokens/a.token'), bindingBBBBBBBB: binding('inst-1', '/srv/tokens/b.token') });
  t.strictSame((await c.tokenFilesFor('instance:inst-1')).sort(), ['/srv/tokens/a.token', '/srv/tokens/b.token'], 'added');
  // Edited in place (same inode): the size differs.
  writeFileSync(c.layout.instances, JSON.stringify({ bindingBBBBBBBB: binding('inst-1', '/srv/tokens/bb.token') }));
  t.strictSame(await c.tokenFilesFor('instance:inst-1'), ['/srv/tokens/bb.token'], 'edited in place');
  replace(c.layout.providers, notion('/srv/cli/notion.token'));
  t.strictSame(await c.tokenFilesFor('cli:notion'), ['/srv/cli/notion.token']);
  replace(c.layout.providers, {});
  t.strictSame(await c.tokenFilesFor('cli:notion'), [c.layout.providerToken('notion')], 'provider removed: the default');
});

t.test('instance slots: an invalid instances.json throws', async (t) => {
  const c = targets();
  replace(c.layout.instances, '{"bindingAAAAAAAA": {"instanceId": "inst-1", "tokenFile": "relative"}}');
  await t.rejects(c.tokenFilesFor('instance:inst-1'));
});

t.test('cli slots: without providers.json → <state>/cli-proxy/<provider>.token', async (t) => {
  const c = targets();
  t.strictSame(await c.tokenFilesFor('cli:notion'), [join(c.layout.cliProxyDir, 'notion.token')]);
});

t.test('cli slots: with providers.json → the catalog tokenFile, else the default', async (t) => {
  const c = targets();
  replace(c.layout.providers, notion('/srv/cli/notion.token'));
  t.strictSame(await c.tokenFilesFor('cli:notion'), ['/srv/cli/notion.token']);
  t.strictSame(await c.tokenFilesFor('cli:github'), [join(c.layout.cliProxyDir, 'github.token')], 'provider not in the catalog');
});

t.test('cli slots: an invalid providers.json throws, every time, naming the file without quoting it', async (t) => {
  const c = targets();
  for (const bad of ['{not json', '[]', '"x"', JSON.stringify({ notion: { tokenFile: 'relative/path' } }), JSON.stringify({ notion: { tokenFile: 42 } }), JSON.stringify({ notion: 'x' })]) {
    replace(c.layout.providers, bad);
    for (const attempt of [1, 2]) {
      const err = await c.tokenFilesFor('cli:notion').then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      t.ok(err, `rejects (${attempt}): ${bad}`);
      t.notMatch(err?.message ?? '', 'not json', 'the error names the file, never quotes it');
    }
  }
});

t.test('an invalid slot id throws', async (t) => {
  const c = targets();
  for (const s of ['inst-1', 'instance:', 'instance:a/b', 'other:x']) await t.rejects(c.tokenFilesFor(s), s);
});

t.test('instance slots: registries that share entries (as apply writes them) index from the last one', async (t) => {
  const layout = stateLayout(join(tempDir('ac-targets-', t), 'state'));
  const files = localConfigFiles(layout);
  const tokenFilesFor = tokenTargets(files, layout);
  const f = (name: string): string => join(layout.forwarderDir, name);
  // As reconcile does: the file written, and the value kept (RememberedFile.wrote).
  const write = async (value: Record<string, ReturnType<typeof binding>>): Promise<void> => {
    replace(layout.instances, value);
    files.instances.wrote(value, statSync(layout.instances));
  };
  const a = binding('inst-1', f('a.token'));
  const b = binding('inst-2', f('b.token'));
  const c = binding('inst-2', f('c.token'));
  await write({ 'bind-0001': a, 'bind-0002': b });
  t.strictSame(await tokenFilesFor('instance:inst-1'), [f('a.token')]);
  t.strictSame(await tokenFilesFor('instance:inst-2'), [f('b.token')]);
  // inst-1 gone, inst-2 gains a second file, inst-3 new; bind-0002's entry is the same object.
  await write({ 'bind-0002': b, 'bind-0003': c, 'bind-0004': binding('inst-3', f('d.token')) });
  t.strictSame(await tokenFilesFor('instance:inst-1'), [join(layout.forwarderDir, 'inst-1.token')], 'gone: the default');
  t.strictSame((await tokenFilesFor('instance:inst-2')).sort(), [f('b.token'), f('c.token')]);
  t.strictSame(await tokenFilesFor('instance:inst-3'), [f('d.token')]);
  // One of inst-2's two bindings moves to another instance; a changed entry under the same id.
  await write({ 'bind-0002': b, 'bind-0003': binding('inst-1', f('c.token')), 'bind-0004': binding('inst-3', f('e.token')) });
  t.strictSame(await tokenFilesFor('instance:inst-2'), [f('b.token')]);
  t.strictSame(await tokenFilesFor('instance:inst-1'), [f('c.token')]);
  t.strictSame(await tokenFilesFor('instance:inst-3'), [f('e.token')]);
  // Everything gone, then an entry of the first registry back.
  await write({});
  t.strictSame(await tokenFilesFor('instance:inst-2'), [join(layout.forwarderDir, 'inst-2.token')], 'an empty registry');
  await write({ 'bind-0001': a });
  t.strictSame(await tokenFilesFor('instance:inst-1'), [f('a.token')]);
});
