import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { readAppliedState } from '../../src/data/applied-state.js';
import { readCatalog, type Catalog } from '../../src/data/catalog.js';
import type { DesiredState } from '../../src/data/desired-state.js';
import { handoffPaths, readSlots, SLOT_MANIFEST_FILE } from '../../src/data/handoff.js';
import { readInstances } from '../../src/data/registry.js';
import { stateLayout } from '../../src/data/state-layout.js';
import { localConfigFiles, RememberedFile } from '../../src/apply/local-config.js';
import { planReconcile, reconcileDesiredState, type ReconcileDeps } from '../../src/apply/reconcile.js';
import { tokenTargets } from '../../src/apply/token-targets.js';
import { memoryLogger } from '../support/memory-log.js';
import type { TapTest } from '../support/tap.js';

const layout = stateLayout('/s');
const B1 = 'bind-aaaaaaaa';
const B2 = 'bind-bbbbbbbb';
const B3 = 'bind-cccccccc';

function state(version: number, bindings: Record<string, string>, providers: string[]): DesiredState {
  return {
    version,
    bindings: Object.fromEntries(Object.entries(bindings).map(([id, inst]) => [id, { instanceId: inst, upstreamUrl: `https://gw.example/${inst}` }])),
    providers: Object.fromEntries(
      providers.map((p) => [p, { upstream: `https://api.example/${p}`, inject: { type: 'header' as const, name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: `${p}-cli`, env: {} }] }]),
    ),
  };
}

t.test('plan: from nothing, everything is new, nothing retired or deleted', async (t) => {
  const plan = planReconcile({ instances: {}, catalog: {}, slots: new Set() }, state(1, { [B1]: 'i1' }, ['gh']), layout);
  t.same(plan.newSlots, ['cli:gh', 'instance:i1']);
  t.same(plan.ensureSlots, ['cli:gh', 'instance:i1']);
  t.same(plan.retireSlots, []);
  t.same(plan.deleteTokenFiles, []);
  t.ok(plan.writeInstances && plan.writeCatalog);
  t.equal(plan.instances[B1]?.tokenFile, '/s/mcp-forwarder/i1.token', 'host-chosen token path');
  t.equal(plan.catalog.gh?.tokenFile, '/s/cli-proxy/gh.token');
});

t.test('plan: a dropped binding and provider are retired and their token files deleted; a shared instance keeps its token', async (t) => {
  const before = planReconcile({ instances: {}, catalog: {}, slots: new Set() }, state(1, { [B1]: 'i1', [B2]: 'i2', [B3]: 'i2' }, ['gh', 'jira']), layout);
  const current = { instances: before.instances, catalog: before.catalog, slots: new Set(before.ensureSlots) };
  const plan = planReconcile(current, state(2, { [B2]: 'i2' }, ['gh']), layout);
  t.same(plan.newSlots, []);
  t.same(plan.retireSlots, ['cli:jira', 'instance:i1']);
  t.same(plan.deleteTokenFiles, ['/s/cli-proxy/jira.token', '/s/mcp-forwarder/i1.token']);
  t.ok(plan.writeInstances && plan.writeCatalog);
});

t.test('plan: a next state that reuses the parsed values (as apply\'s parse does): only what differs is retired and deleted', async (t) => {
  const s1 = state(1, { [B1]: 'i1', [B2]: 'i2', [B3]: 'i2' }, ['gh', 'jira']);
  const first = planReconcile({ instances: {}, catalog: {}, slots: new Set() }, s1, layout);
  const current = { instances: first.instances, catalog: first.catalog, slots: new Set(first.ensureSlots) };
  // B3 gone, its instance still bound by B2: nothing retired, no token deleted.
  const s2: DesiredState = { version: 2, bindings: { [B1]: s1.bindings[B1]!, [B2]: s1.bindings[B2]! }, providers: s1.providers };
  const second = planReconcile(current, s2, layout);
  t.equal(second.instances[B1], first.instances[B1], 'the unchanged entry is the same object');
  t.same([second.retireSlots, second.deleteTokenFiles, second.newSlots], [[], [], []]);
  t.ok(second.writeInstances);
  t.notOk(second.writeCatalog, 'the same catalog');
  // B1 moved to another instance and jira gone: i1 and jira retired, their tokens deleted.
  const s3: DesiredState = { version: 3, bindings: { [B1]: { instanceId: 'i3', upstreamUrl: 'https://gw.example/i3' }, [B2]: s1.bindings[B2]! }, providers: { gh: s1.providers.gh! } };
  const third = planReconcile({ instances: second.instances, catalog: second.catalog, slots: new Set(second.ensureSlots) }, s3, layout);
  t.same(third.newSlots, ['instance:i3']);
  t.same(third.retireSlots, ['cli:jira', 'instance:i1']);
  t.same(third.deleteTokenFiles, ['/s/cli-proxy/jira.token', '/s/mcp-forwarder/i1.token']);
});

t.test('plan: the same state is no write; slot files of nothing (a crash after the registry write) are still retired and their tokens deleted', async (t) => {
  const s = state(3, { [B1]: 'i1' }, []);
  const first = planReconcile({ instances: {}, catalog: {}, slots: new Set() }, s, layout);
  const plan = planReconcile({ instances: first.instances, catalog: first.catalog, slots: new Set(['instance:i1', 'instance:old', 'cli:gone']) }, s, layout);
  t.notOk(plan.writeInstances || plan.writeCatalog, 'nothing to write');
  t.same(plan.retireSlots, ['cli:gone', 'instance:old']);
  t.same(plan.deleteTokenFiles, ['/s/cli-proxy/gone.token', '/s/mcp-forwarder/old.token']);
});

t.test('plan: an operator token path in the old registry is deleted when its binding goes', async (t) => {
  const current = { instances: { [B1]: { instanceId: 'i1', upstreamUrl: 'https://gw.example/i1', tokenFile: '/etc/custom/i1.token' } }, catalog: {} as Catalog, slots: new Set(['instance:i1']) };
  const plan = planReconcile(current, state(1, {}, []), layout);
  t.same(plan.deleteTokenFiles, ['/etc/custom/i1.token', '/s/mcp-forwarder/i1.token']);
});

function setup(t: TapTest): { deps: ReconcileDeps; root: string; rendered: Catalog[]; write: (v: unknown) => void; records: ReturnType<typeof memoryLogger>['records'] } {
  const root = mkdtempSync(join(tmpdir(), 'ac-reconcile-'));
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const l = stateLayout(root);
  mkdirSync(join(l.handoff, 'slots'), { recursive: true });
  const { log, records } = memoryLogger();
  const rendered: Catalog[] = [];
  const deps: ReconcileDeps = {
    paths: handoffPaths(l.handoff),
    layout: l,
    local: localConfigFiles(l),
    renderShims: async (c) => void rendered.push(c),
    log,
    memo: {},
  };
  return { deps, root, rendered, records, write: (v) => writeFileSync(deps.paths.desiredState, typeof v === 'string' ? v : JSON.stringify(v)) };
}

t.test('reconcile: no file → nothing; a state → files 0600, slots, shims, applied-state; dropping deletes token files', async (t) => {
  const { deps, root, rendered, write } = setup(t);
  const l = stateLayout(root);
  t.same(await reconcileDesiredState(deps), { kind: 'absent' });
  t.notOk(existsSync(l.instances));

  write(state(1, { [B1]: 'i1' }, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 1 });
  t.equal(statSync(l.instances).mode & 0o777, 0o600);
  t.equal(statSync(l.providers).mode & 0o777, 0o600);
  t.same((await readSlots(deps.paths)).slots.map((s) => s.slot), ['cli:gh', 'instance:i1']);
  t.equal(rendered.length, 1);
  t.match(await readAppliedState(l.handoff), { version: 1 });
  t.same(await reconcileDesiredState(deps), { kind: 'unchanged' }, 'a rescan of the same file does nothing');

  writeFileSync(l.instanceToken('i1'), 'tok\n');
  writeFileSync(l.providerToken('gh'), 'tok\n');
  write(state(2, {}, []));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 2 });
  t.notOk(existsSync(l.instanceToken('i1')), 'binding token deleted');
  t.notOk(existsSync(l.providerToken('gh')), 'provider token deleted');
  t.same((await readSlots(deps.paths)).slots, [], 'slots retired');
  t.same(JSON.parse(readFileSync(l.instances, 'utf8')), {});
});

t.test('reconcile: an invalid state is rejected whole, the last good one kept, the reason logged without the value', async (t) => {
  const { deps, root, write, records } = setup(t);
  const l = stateLayout(root);
  write(state(1, { [B1]: 'i1' }, []));
  await reconcileDesiredState(deps);
  const good = readFileSync(l.instances, 'utf8');
  const bad = state(2, { [B1]: 'i1', [B2]: 'i2' }, []);
  (bad.bindings[B2] as { upstreamUrl: string }).upstreamUrl = 'http://secret-host.example/x';
  write(bad);
  t.match(await reconcileDesiredState(deps), { kind: 'rejected', version: 2 });
  t.equal(readFileSync(l.instances, 'utf8'), good, 'registry untouched');
  t.match(await readAppliedState(l.handoff), { version: 1, rejected: { version: 2 } });
  t.notOk(JSON.stringify(records).includes('secret-host'), 'no value in the log');

  write('{not json');
  t.match(await reconcileDesiredState(deps), { kind: 'rejected', version: null });
  write(state(0, {}, []));
  t.match(await reconcileDesiredState(deps), { kind: 'stale', version: 0, inForce: 1 }, 'older than in force: ignored');
  t.equal(readFileSync(l.instances, 'utf8'), good);
});

t.test("reconcile: a state naming a host tool is rejected whole, unless the operator allows it; a refused allow file allows nothing", async (t) => {
  const { deps, root, rendered, write, records } = setup(t);
  const l = stateLayout(root);
  write(state(1, {}, ['gh']));
  await reconcileDesiredState(deps);
  const goodCatalog = readFileSync(l.providers, 'utf8');
  const hostile = state(2, {}, ['gh', 'evil']);
  (hostile.providers.evil as { commands: Array<{ name: string; env: Record<string, string> }> }).commands = [{ name: 'ls', env: {} }];
  write(hostile);
  const r = await reconcileDesiredState(deps);
  t.match(r, { kind: 'rejected', version: 2, error: 'providers.evil.commands.0.name: command "ls" is one of the host\'s own tools (coreutils); only the operator may allow it, in the allowed-commands file' });
  t.equal(readFileSync(l.providers, 'utf8'), goodCatalog, 'the catalog in force is untouched');
  t.equal(rendered.length, 1, 'no shim rendered for it');
  t.match(await readAppliedState(l.handoff), { version: 1, rejected: { version: 2, error: /command "ls"/ } });

  // The operator's file refused (not root's alone, say) allows nothing, and says so.
  deps.allowedCommands = async () => {
    throw new Error('/etc/agent-connectors/allowed-commands must be owned by root');
  };
  write({ ...hostile, version: 3 });
  t.match(await reconcileDesiredState(deps), { kind: 'rejected', version: 3 });
  t.ok(records.some((rec) => rec.msg === 'allowed-commands file refused; no host tool may be shimmed'), 'the refusal is logged');

  deps.allowedCommands = async () => new Set(['ls']);
  write({ ...hostile, version: 4 });
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 4 }, 'allowed by the operator: applied');
  t.same(rendered.at(-1)?.evil?.commands.map((c) => c.name), ['ls']);
});

t.test('reconcile keeps what it wrote: token targets and the next version come from memory, not a read-back', async (t) => {
  const { deps, root, write } = setup(t);
  const l = stateLayout(root);
  const reads = { instances: 0, catalog: 0 };
  const counted = <T>(kind: keyof typeof reads, read: (path: string) => Promise<T>) => (path: string) => {
    reads[kind] += 1;
    return read(path);
  };
  deps.local = {
    instances: new RememberedFile(l.instances, counted('instances', readInstances)),
    catalog: new RememberedFile(l.providers, counted('catalog', readCatalog)),
  };
  const targetsOf = tokenTargets(deps.local, l);
  write(state(1, { [B1]: 'i1' }, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 1 });
  t.same(reads, { instances: 1, catalog: 1 }, 'read once, at start');
  t.same(await targetsOf('instance:i1'), [l.instanceToken('i1')]);
  t.same(await targetsOf('cli:gh'), [l.providerToken('gh')]);
  write(state(2, { [B1]: 'i1', [B2]: 'i2' }, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 2 });
  t.same(await targetsOf('instance:i2'), [l.instanceToken('i2')]);
  t.same(reads, { instances: 1, catalog: 1 }, 'what was written is not read back');

  // Someone else replaced the registry (an operator's edit): that is read.
  const edited = { [B3]: { instanceId: 'i3', upstreamUrl: 'https://gw.example/i3', tokenFile: join(root, 'custom-i3.token') } };
  writeFileSync(`${l.instances}.new`, JSON.stringify(edited));
  renameSync(`${l.instances}.new`, l.instances);
  t.same(await targetsOf('instance:i3'), [join(root, 'custom-i3.token')]);
  t.same(reads, { instances: 2, catalog: 1 });
});

t.test('reconcile: a state changing bindings only reads no slot file and renders no shim; a catalog change renders them', async (t) => {
  const { deps, rendered, write, records } = setup(t);
  const many = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`bind_many_${String(i).padStart(4, '0')}`, `m${i}`]));
  write(state(1, many, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 1 });
  t.equal(rendered.length, 1);
  const { bind_many_0000: _gone, ...rest } = many;
  write(state(2, rest, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 2, plan: { retireSlots: ['instance:m0'] } });
  t.match(records.at(-1), { msg: 'desired state applied', version: 2, slotFilesRead: 0 }, 'no slot file read');
  t.equal(rendered.length, 1, 'the same catalog: no shim rendered');
  write(state(3, rest, ['gh', 'notion']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 3 });
  t.equal(rendered.length, 2, 'a new catalog: rendered');
  t.same(Object.keys(rendered.at(-1) ?? {}).sort(), ['gh', 'notion']);

  // A new process knows nothing yet: it renders once, whatever the catalog.
  const restarted = { ...deps, memo: {} };
  write(state(4, many, ['gh', 'notion']));
  t.match(await reconcileDesiredState(restarted), { kind: 'applied', version: 4 });
  t.equal(rendered.length, 3);
});

t.test('reconcile: a new process heals the state in force: a lost manifest or an emptied slot file is made again, shims rendered again, a revoked slot stays revoked', async (t) => {
  const { deps, rendered, write } = setup(t);
  write(state(1, { [B1]: 'i1', [B2]: 'i2', [B3]: 'i3' }, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 1 });
  // Slots holding a token have their own file (apply's inbox writes them, without an fsync each).
  const held = (slot: string): string => JSON.stringify({ slot, tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 });
  writeFileSync(join(deps.paths.slots, 'instance:i2.json'), held('instance:i2'));
  // What a power loss can leave: the manifest gone (as if never renamed in), a slot file empty.
  rmSync(join(deps.paths.slots, SLOT_MANIFEST_FILE));
  writeFileSync(join(deps.paths.slots, 'cli:gh.json'), '');
  const revoked = { slot: 'instance:i3', tokenId: null, expiresAt: null, generation: 0, revoked: true };
  writeFileSync(join(deps.paths.slots, 'instance:i3.json'), JSON.stringify(revoked));
  const untouched = statSync(join(deps.paths.slots, 'instance:i2.json')).ino;
  t.same(await reconcileDesiredState(deps), { kind: 'unchanged' }, 'the same process: nothing read again');
  t.notOk(existsSync(join(deps.paths.slots, SLOT_MANIFEST_FILE)), 'not healed by a rescan');

  const restarted = { ...deps, memo: {} };
  t.same(await reconcileDesiredState(restarted), { kind: 'unchanged' }, 'the next start: the version is in force');
  const { slots, errors } = await readSlots(deps.paths);
  t.same(errors, [], 'no unreadable slot file left');
  t.same(slots.map((s) => s.slot), ['cli:gh', 'instance:i1', 'instance:i2', 'instance:i3']);
  t.same(manifestIds(deps), ['cli:gh', 'instance:i1', 'instance:i2', 'instance:i3'], 'the manifest written again');
  t.notOk(existsSync(join(deps.paths.slots, 'instance:i1.json')), 'an empty slot needs no file');
  t.equal(statSync(join(deps.paths.slots, 'instance:i2.json')).ino, untouched, 'a good slot file is not rewritten');
  t.same(JSON.parse(readFileSync(join(deps.paths.slots, 'instance:i3.json'), 'utf8')), revoked, 'the revoked slot is left revoked');
  t.equal(rendered.length, 2, 'the shims rendered again');
  t.equal(statSync(join(deps.paths.slots, SLOT_MANIFEST_FILE)).mode & 0o777, 0o640);
});

t.test('reconcile: a new state is one manifest, no slot file; retirement drops ids from it and deletes their files; empty files of a previous version are left valid', async (t) => {
  const { deps, write } = setup(t);
  const many = Object.fromEntries(Array.from({ length: 300 }, (_, i) => [`bind_many_${String(i).padStart(4, '0')}`, `m${i}`]));
  // A previous version wrote an empty file per slot: one of them left from it.
  mkdirSync(deps.paths.slots, { recursive: true });
  writeFileSync(join(deps.paths.slots, 'instance:m1.json'), JSON.stringify({ slot: 'instance:m1', tokenId: null, expiresAt: null, generation: 0 }));
  write(state(1, many, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 1 });
  t.same(readdirSync(deps.paths.slots).sort(), ['instance:m1.json', SLOT_MANIFEST_FILE], 'one manifest; the old empty file left');
  t.equal(manifestIds(deps).length, 301, 'every slot named');
  t.equal((await readSlots(deps.paths)).slots.length, 301);

  // m0 holds a token (its file written by apply's inbox); m0 and m1 and m2 go.
  writeFileSync(join(deps.paths.slots, 'instance:m0.json'), JSON.stringify({ slot: 'instance:m0', tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 }));
  const { bind_many_0000: _a, bind_many_0001: _b, bind_many_0002: _c, ...rest } = many;
  write(state(2, rest, ['gh']));
  t.match(await reconcileDesiredState(deps), { kind: 'applied', version: 2, plan: { retireSlots: ['instance:m0', 'instance:m1', 'instance:m2'] } });
  t.same(readdirSync(deps.paths.slots), [SLOT_MANIFEST_FILE], 'their files deleted');
  const ids = manifestIds(deps);
  t.equal(ids.length, 298);
  t.notOk(ids.some((s) => ['instance:m0', 'instance:m1', 'instance:m2'].includes(s)), 'and their ids dropped');

  // A planted manifest naming a slot the state does not want: apply retires it (never keeps it).
  writeFileSync(join(deps.paths.slots, SLOT_MANIFEST_FILE), `${JSON.stringify({ v: 1, slots: [...ids, 'instance:planted'].sort() })}\n`);
  write(state(3, rest, ['gh']));
  t.match(await reconcileDesiredState({ ...deps, memo: {} }), { kind: 'applied', version: 3, plan: { retireSlots: ['instance:planted'] } });
  t.same(manifestIds(deps), ids, 'the manifest is the state\'s again');
});

function manifestIds(deps: ReconcileDeps): string[] {
  return (JSON.parse(readFileSync(join(deps.paths.slots, SLOT_MANIFEST_FILE), 'utf8')) as { slots: string[] }).slots;
}
