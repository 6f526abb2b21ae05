import {
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { execFileSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import t from 'tap';
import { stateLayout, type StateLayout } from '../../src/data/state-layout.js';
import { applyInbox, isNewer, type ApplyDeps } from '../../src/apply/inbox.js';
import { localConfigFiles } from '../../src/apply/local-config.js';
import { batchFileName, emptySlotFile, handoffPaths, MAX_BATCH_FILE_BYTES, readSlotFile, type HandoffPaths, type SlotFile } from '../../src/data/handoff.js';
import { tokenTargets } from '../../src/apply/token-targets.js';
import { readTokenFile } from '../../src/token/token-file.js';
import type { RenewOk } from '../../src/data/renew-wire.js';
import { memoryLogger, type LogRecord } from '../support/memory-log.js';
import { tempDir } from '../support/temp-dir.js';

const SLOT = 'instance:inst-1';
const NOW = Date.UTC(2030, 0, 1, 12, 0, 0);

interface Env {
  root: string;
  p: HandoffPaths;
  tokenFile: string;
  deps: ApplyDeps;
  records: LogRecord[];
  lines: string[];
  tokenCalls: string[];
}

function env(overrides: Partial<ApplyDeps> = {}): Env {
  const root = tempDir('ac-apply-', t);
  const p = handoffPaths(join(root, 'handoff'));
  const tokenFile = join(root, 'state', 'mcp-forwarder', 'inst-1.token');
  const { log, records, lines } = memoryLogger();
  const tokenCalls: string[] = [];
  const deps: ApplyDeps = {
    paths: p,
    log,
    now: () => NOW,
    tokenFilesFor: async (slot) => {
      tokenCalls.push(slot);
      return [tokenFile];
    },
    ...overrides,
  };
  return { root, p, tokenFile, deps, records, lines, tokenCalls };
}

function body(over: Partial<RenewOk> = {}): RenewOk {
  return {
    slot: SLOT,
    tokenId: 'tok-1',
    token: 'gw_token-one-SECRET',
    expiresAt: '2030-01-01T13:00:00.000Z',
    credentialGeneration: 1,
    ...over,
  };
}

/** Writes an inbox file the way fetch does: temp file, then rename into place. */
function putInbox(p: HandoffPaths, name: string, content: string | Buffer): string {
  mkdirSync(p.inbox, { recursive: true });
  const tmp = join(p.inbox, `.${name}.tmp-${Math.random().toString(36).slice(2)}`);
  writeFileSync(tmp, content, { mode: 0o640 });
  const final = join(p.inbox, name);
  renameSync(tmp, final);
  return final;
}

function putBody(p: HandoffPaths, b: RenewOk | Record<string, unknown>, slot = SLOT): string {
  return putInbox(p, `${slot}.json`, `${JSON.stringify(b)}\n`);
}

function modeOf(path: string): number {
  return statSync(path).mode & 0o777;
}

function slotJson(p: HandoffPaths, slot = SLOT): unknown {
  return JSON.parse(readFileSync(join(p.slots, `${slot}.json`), 'utf8')) as unknown;
}

function inboxNames(p: HandoffPaths): string[] {
  return existsSync(p.inbox) ? readdirSync(p.inbox).sort() : [];
}

// ───────────────────────────── isNewer ─────────────────────────────

t.test('isNewer: truth table', async (t) => {
  const applied: SlotFile = { slot: SLOT, tokenId: 'tok-5', expiresAt: '2030-01-01T12:00:00.000Z', generation: 5 };
  const cand = (tokenId: string, credentialGeneration: number, expiresAt: string): { tokenId: string; credentialGeneration: number; expiresAt: string } => ({
    tokenId,
    credentialGeneration,
    expiresAt,
  });
  const later = '2030-01-01T13:00:00.000Z';
  const earlier = '2030-01-01T11:00:00.000Z';
  const same = '2030-01-01T12:00:00.000Z';
  const rows: Array<[string, ReturnType<typeof cand>, SlotFile, boolean]> = [
    ['same tokenId, higher generation, later expiry', cand('tok-5', 6, later), applied, false],
    ['same tokenId, same everything (replay)', cand('tok-5', 5, same), applied, false],
    ['new tokenId, higher generation, later expiry', cand('tok-6', 6, later), applied, true],
    ['new tokenId, higher generation, EARLIER expiry', cand('tok-6', 6, earlier), applied, true],
    ['new tokenId, lower generation, later expiry', cand('tok-4', 4, later), applied, false],
    ['new tokenId, lower generation, earlier expiry', cand('tok-4', 4, earlier), applied, false],
    ['new tokenId, same generation, later expiry', cand('tok-x', 5, later), applied, true],
    ['new tokenId, same generation, same expiry', cand('tok-x', 5, same), applied, false],
    ['new tokenId, same generation, earlier expiry', cand('tok-x', 5, earlier), applied, false],
    ['same instant, other offset notation', cand('tok-x', 5, '2030-01-01T13:00:00+01:00'), applied, false],
    ['later instant despite an "earlier" looking string', cand('tok-x', 5, '2030-01-01T12:30:00-01:00'), applied, true],
    ['fresh slot (gen 0, no token), gen 1', cand('tok-1', 1, later), emptySlotFile(SLOT), true],
    ['fresh slot (gen 0, no token), gen 0', cand('tok-1', 0, later), emptySlotFile(SLOT), true],
  ];
  for (const [what, c, a, want] of rows) t.equal(isNewer(c, a), want, what);
});

// ───────────────────────────── applying ─────────────────────────────

t.test('applies a fresh inbox file: token file 0600, slot file 0640 with appliedAt, inbox emptied', async (t) => {
  const e = env();
  const b = body();
  putBody(e.p, b);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 1, ignored: 0, rejected: 0 });
  t.strictSame(e.tokenCalls, [SLOT]);
  const read = readTokenFile(e.tokenFile);
  t.strictSame(read, { ok: true, token: b.token }, 'the forwarder reads exactly the token');
  t.match(readFileSync(e.tokenFile, 'utf8'), /^gw_token-one-SECRET\r?\n?$/, 'nothing but the token and one line ending');
  t.equal(modeOf(e.tokenFile), 0o600, 'token file 0600');
  t.equal(modeOf(join(e.p.slots, `${SLOT}.json`)), 0o640, 'slot file 0640');
  t.strictSame(slotJson(e.p), {
    slot: SLOT,
    tokenId: 'tok-1',
    expiresAt: '2030-01-01T13:00:00.000Z',
    generation: 1,
    appliedAt: new Date(NOW).toISOString(),
  });
  t.notMatch(readFileSync(join(e.p.slots, `${SLOT}.json`), 'utf8'), b.token, 'no secret in the slot file');
  t.strictSame(inboxNames(e.p), [], 'inbox file removed');
  t.notOk(existsSync(e.p.rejected) && readdirSync(e.p.rejected).length > 0, 'nothing rejected');
  for (const line of e.lines) t.notMatch(line, 'SECRET', 'no token in the log');
  t.ok(e.records.some((r) => r.msg === 'token applied'));
});

t.test('applying a newer token replaces the old one', async (t) => {
  const e = env();
  putBody(e.p, body());
  await applyInbox(e.deps);
  putBody(e.p, body({ tokenId: 'tok-2', token: 'gw_token-two', credentialGeneration: 2, expiresAt: '2030-01-01T14:00:00.000Z' }));
  t.strictSame(await applyInbox({ ...e.deps, now: () => NOW + 1000 }), { applied: 1, ignored: 0, rejected: 0 });
  t.strictSame(readTokenFile(e.tokenFile), { ok: true, token: 'gw_token-two' });
  t.match(slotJson(e.p), { tokenId: 'tok-2', generation: 2, appliedAt: new Date(NOW + 1000).toISOString() });
  t.equal(modeOf(e.tokenFile), 0o600);
});

t.test('a replay is a no-op: token file, slot file untouched; inbox file removed', async (t) => {
  const e = env();
  const b = body();
  putBody(e.p, b);
  await applyInbox(e.deps);
  const tokenIno = statSync(e.tokenFile).ino;
  const slotText = readFileSync(join(e.p.slots, `${SLOT}.json`), 'utf8');
  const slotIno = statSync(join(e.p.slots, `${SLOT}.json`)).ino;
  e.tokenCalls.length = 0;

  putBody(e.p, b);
  const stats = await applyInbox({ ...e.deps, now: () => NOW + 60_000 });
  t.strictSame(stats, { applied: 0, ignored: 1, rejected: 0 });
  t.equal(statSync(e.tokenFile).ino, tokenIno, 'token file not rewritten');
  t.equal(readFileSync(join(e.p.slots, `${SLOT}.json`), 'utf8'), slotText, 'slot file identical (appliedAt not bumped)');
  t.equal(statSync(join(e.p.slots, `${SLOT}.json`)).ino, slotIno, 'slot file not rewritten');
  t.strictSame(e.tokenCalls, [], 'token targets not even looked up');
  t.strictSame(inboxNames(e.p), [], 'the replayed file is consumed');
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 0, rejected: 0 }, 'an empty inbox does nothing');
});

t.test('an older token never overwrites a newer one', async (t) => {
  const e = env();
  putBody(e.p, body({ tokenId: 'tok-3', token: 'gw_three', credentialGeneration: 3, expiresAt: '2030-01-01T15:00:00.000Z' }));
  await applyInbox(e.deps);
  const slotText = readFileSync(join(e.p.slots, `${SLOT}.json`), 'utf8');

  const older = [
    body({ tokenId: 'tok-2', token: 'gw_two', credentialGeneration: 2, expiresAt: '2030-01-01T16:00:00.000Z' }),
    body({ tokenId: 'tok-3b', token: 'gw_three-b', credentialGeneration: 3, expiresAt: '2030-01-01T14:00:00.000Z' }),
    body({ tokenId: 'tok-3c', token: 'gw_three-c', credentialGeneration: 3, expiresAt: '2030-01-01T15:00:00.000Z' }),
    body({ tokenId: 'tok-0', token: 'gw_zero', credentialGeneration: 0, expiresAt: '2031-01-01T00:00:00.000Z' }),
  ];
  for (const o of older) {
    putBody(e.p, o);
    t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 1, rejected: 0 }, o.tokenId);
    t.strictSame(readTokenFile(e.tokenFile), { ok: true, token: 'gw_three' }, `${o.tokenId}: token file keeps the newer token`);
    t.equal(readFileSync(join(e.p.slots, `${SLOT}.json`), 'utf8'), slotText, `${o.tokenId}: slot file unchanged`);
    t.strictSame(inboxNames(e.p), [], `${o.tokenId}: consumed`);
  }
  putBody(e.p, body({ tokenId: 'tok-3d', token: 'gw_three-d', credentialGeneration: 3, expiresAt: '2030-01-01T15:00:01.000Z' }));
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 }, 'same generation, later expiry: applied');
  t.strictSame(readTokenFile(e.tokenFile), { ok: true, token: 'gw_three-d' });
});

t.test('invalid inbox files are moved to rejected/ byte for byte, never applied, reasons logged without content', async (t) => {
  const e = env();
  const b = body({ token: 'gw_SECRET-in-a-bad-file' });
  const files: Record<string, Buffer> = {
    [`${SLOT}.json`]: Buffer.from(`${JSON.stringify(b).slice(0, 40)}`), // torn
    'instance:extra.json': Buffer.from(JSON.stringify({ ...b, slot: 'instance:extra', extra: 'x' })),
    'instance:other.json': Buffer.from(JSON.stringify(b)), // slot field ≠ file name
    'instance:badtok.json': Buffer.from(JSON.stringify({ ...b, slot: 'instance:badtok', token: 'gw_SECRET with space' })),
    'instance:empty.json': Buffer.alloc(0),
    'instance:bin.json': Buffer.from([0x7b, 0x00, 0xff, 0xfe, 0x0a]),
    'not-a-slot.json': Buffer.from(JSON.stringify(b)),
    'notes.txt': Buffer.from('gw_SECRET notes'),
  };
  for (const [name, content] of Object.entries(files)) putInbox(e.p, name, content);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 0, ignored: 0, rejected: Object.keys(files).length });
  t.strictSame(inboxNames(e.p), [], 'nothing left in the inbox');
  t.notOk(existsSync(e.tokenFile), 'no token file written');
  t.notOk(existsSync(join(e.p.slots, `${SLOT}.json`)), 'no slot file written');
  t.strictSame(e.tokenCalls, []);
  const rejected = readdirSync(e.p.rejected);
  t.equal(rejected.length, Object.keys(files).length, 'every file kept aside');
  for (const [name, content] of Object.entries(files)) {
    const kept = rejected.filter((r) => r.startsWith(`${name}.`) && r.endsWith('.rejected'));
    t.equal(kept.length, 1, `${name}: kept once`);
    const keptName = kept[0];
    if (keptName === undefined) continue;
    t.ok(readFileSync(join(e.p.rejected, keptName)).equals(content), `${name}: identical bytes`);
  }
  const errors = e.records.filter((r) => r.level === 50);
  t.equal(errors.length, Object.keys(files).length, 'one error line per rejected file');
  for (const r of errors) t.ok(typeof r.reason === 'string' && r.reason.length > 0, `${String(r.file)}: a reason (${String(r.reason)})`);
  for (const line of e.lines) t.notMatch(line, 'SECRET', 'no file content in the log');
});

t.test('two invalid files for one slot rejected at the same instant are both kept', async (t) => {
  // The clock is injected and fixed, as two runs within one millisecond would see it.
  const e = env();
  putInbox(e.p, `${SLOT}.json`, 'first bad file');
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 0, rejected: 1 });
  putInbox(e.p, `${SLOT}.json`, 'second bad file');
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 0, rejected: 1 });
  const kept = readdirSync(e.p.rejected).map((n) => readFileSync(join(e.p.rejected, n), 'utf8')).sort();
  t.strictSame(kept, ['first bad file', 'second bad file'], 'never lost: the second does not overwrite the first');
});

t.test('a rejected file does not stop the valid ones', async (t) => {
  const e = env();
  putInbox(e.p, 'instance:aaa.json', '{not json');
  putBody(e.p, body());
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 1 });
  t.strictSame(readTokenFile(e.tokenFile), { ok: true, token: body().token });
});

t.test('a writer\'s temp dotfile in the inbox is left alone', async (t) => {
  const e = env();
  mkdirSync(e.p.inbox, { recursive: true });
  const tmp = join(e.p.inbox, `.${SLOT}.json.tmp-123`);
  writeFileSync(tmp, '{"slot":"instance:inst-1","tok');
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 0, rejected: 0 });
  t.equal(readFileSync(tmp, 'utf8'), '{"slot":"instance:inst-1","tok', 'still there, untouched');
});

t.test('a symlinked inbox file is rejected, its target is not read or moved', async (t) => {
  const e = env();
  const outside = join(e.root, 'outside.json');
  writeFileSync(outside, JSON.stringify(body()));
  mkdirSync(e.p.inbox, { recursive: true });
  symlinkSync(outside, join(e.p.inbox, `${SLOT}.json`));
  const stats = await applyInbox(e.deps);
  t.equal(stats.applied, 0);
  t.equal(stats.rejected, 1);
  t.notOk(existsSync(e.tokenFile), 'not applied through the link');
  t.equal(readFileSync(outside, 'utf8'), JSON.stringify(body()), 'target untouched');
});

t.test('a revocation notice marks the slot revoked and deletes the token file at once (SPEC §8)', async (t) => {
  const e = env();
  putBody(e.p, body());
  await applyInbox(e.deps);
  e.tokenCalls.length = 0;
  putBody(e.p, { slot: SLOT, revoked: true, at: '2030-01-01T12:30:00.000Z' });
  const stats = await applyInbox(e.deps);
  t.equal(stats.rejected, 0);
  t.equal(stats.applied + stats.ignored, 1, 'handled');
  const slot = await readSlotFile(e.p, SLOT);
  t.equal(slot?.revoked, true, 'slot marked revoked');
  t.match(slot, { slot: SLOT, tokenId: 'tok-1', generation: 1 }, 'what was applied is still recorded');
  t.equal(modeOf(join(e.p.slots, `${SLOT}.json`)), 0o640);
  t.strictSame(inboxNames(e.p), []);
  t.strictSame(e.tokenCalls, [SLOT], 'the slot\'s token files looked up');
  t.notOk(existsSync(e.tokenFile), 'the dead token is deleted');
  t.ok(e.records.some((r) => r.level === 40 && r.slot === SLOT), 'a warning names the slot');
});

t.test('a revocation notice for a slot with no slot file yet creates it revoked', async (t) => {
  const e = env();
  putBody(e.p, { slot: 'cli:notion', revoked: true, at: '2030-01-01T12:30:00.000Z' }, 'cli:notion');
  await applyInbox(e.deps);
  t.match(await readSlotFile(e.p, 'cli:notion'), { slot: 'cli:notion', tokenId: null, revoked: true });
});

t.test('a slot file whose slot field names another slot never makes apply write that other slot', async (t) => {
  const e = env();
  mkdirSync(e.p.slots, { recursive: true });
  // A hand-edited or misplaced slots/instance:inst-1.json that claims to be instance:other.
  writeFileSync(join(e.p.slots, `${SLOT}.json`), JSON.stringify(emptySlotFile('instance:other')));
  putBody(e.p, { slot: SLOT, revoked: true, at: '2030-01-01T12:30:00.000Z' });
  await applyInbox(e.deps);
  t.notOk(existsSync(join(e.p.slots, 'instance:other.json')), 'instance:other was never revoked: no file written for it');
});

t.test('an inbox file replaced by a newer one while being applied is not deleted', async (t) => {
  const e = env();
  const first = body();
  const newer = body({ tokenId: 'tok-2', token: 'gw_token-two', credentialGeneration: 2, expiresAt: '2030-01-01T14:00:00.000Z' });
  let swapped = 0;
  const deps: ApplyDeps = {
    ...e.deps,
    // fetch renames a newer answer into place while apply is between reading and removing.
    tokenFilesFor: async (slot) => {
      if (swapped === 0) {
        putBody(e.p, newer);
        swapped += 1;
      }
      return [e.tokenFile];
    },
  };
  putBody(e.p, first);
  const path = join(e.p.inbox, `${SLOT}.json`);
  const inoBefore = statSync(path).ino;
  const stats = await applyInbox(deps);
  t.equal(swapped, 1, 'the newer file arrived mid-apply');
  t.equal(stats.rejected + stats.ignored, 0);
  if (stats.applied === 1) {
    // This run applied what it read and left the newer file for the next run.
    t.strictSame(readTokenFile(e.tokenFile), { ok: true, token: first.token }, 'the file read was applied');
    t.ok(existsSync(path), 'the newer inbox file survived');
    t.not(statSync(path).ino, inoBefore, 'it is the new inode');
    t.strictSame(JSON.parse(readFileSync(path, 'utf8')) as unknown, newer, 'with the newer content');
  } else {
    // Or it noticed the newer file in the same run and applied it too.
    t.equal(stats.applied, 2, 'both applied in one run');
  }
  await applyInbox(deps);
  t.strictSame(readTokenFile(e.tokenFile), { ok: true, token: newer.token }, 'in the end the newer token is applied');
  t.match(slotJson(e.p), { tokenId: 'tok-2', generation: 2 });
  t.strictSame(inboxNames(e.p), []);
});

t.test('a token file path that is a symlink is not followed; the inbox file stays for the next run', async (t) => {
  const e = env();
  const victim = join(e.root, 'victim');
  writeFileSync(victim, 'do not overwrite');
  mkdirSync(join(e.root, 'state', 'mcp-forwarder'), { recursive: true });
  symlinkSync(victim, e.tokenFile);
  putBody(e.p, body());
  const stats = await applyInbox(e.deps);
  t.equal(stats.applied, 0);
  t.equal(readFileSync(victim, 'utf8'), 'do not overwrite');
  t.strictSame(inboxNames(e.p), [`${SLOT}.json`], 'not lost');
  t.notOk(existsSync(join(e.p.slots, `${SLOT}.json`)), 'slot file not advanced');
});

// ───────────────────────────── with real token targets ─────────────────────────────

function targets(): { root: string; layout: StateLayout; tokenFilesFor: ApplyDeps['tokenFilesFor'] } {
  const root = tempDir('ac-targets-', t);
  const layout = stateLayout(join(root, 'state'));
  return { root, layout, tokenFilesFor: tokenTargets(localConfigFiles(layout), layout) };
}

function writeConfig(path: string, content: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, content, { mode: 0o600 });
}

const binding = (instanceId: string, tokenFile: string): { instanceId: string; upstreamUrl: string; tokenFile: string } => ({
  instanceId,
  upstreamUrl: 'https://gw.example/mcp',
  tokenFile,
});

t.test('applyInbox with real token targets: one token written to every bound file', async (t) => {
  const c = targets();
  const a = join(c.root, 'tokens', 'a.token');
  const b = join(c.root, 'tokens', 'b.token');
  writeConfig(c.layout.instances, JSON.stringify({ bindingAAAAAAAA: binding('inst-1', a), bindingBBBBBBBB: binding('inst-1', b) }));
  const e = env({ tokenFilesFor: c.tokenFilesFor });
  putBody(e.p, body());
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 });
  for (const f of [a, b]) {
    t.strictSame(readTokenFile(f), { ok: true, token: body().token }, f);
    t.equal(modeOf(f), 0o600);
  }
});

t.test('applyInbox with an invalid providers.json: the cli token is neither applied nor lost', async (t) => {
  const c = targets();
  writeConfig(c.layout.providers, '{not json');
  const e = env({ tokenFilesFor: c.tokenFilesFor });
  const cliBody = body({ slot: 'cli:notion' });
  putBody(e.p, cliBody, 'cli:notion');
  const stats = await applyInbox(e.deps);
  t.equal(stats.applied, 0);
  t.equal(stats.rejected, 0, 'a valid inbox file is not rejected for a catalog problem');
  t.strictSame(inboxNames(e.p), ['cli:notion.json'], 'left in place for the next run');
  t.notOk(existsSync(join(e.p.slots, 'cli:notion.json')), 'slot file not advanced');
  t.ok(e.records.some((r) => r.level === 50), 'the failure is logged');
  for (const line of e.lines) t.notMatch(line, cliBody.token);

  writeConfig(
    c.layout.providers,
    JSON.stringify({
      notion: {
        upstream: 'https://api.notion.com',
        tokenFile: join(c.root, 'cli', 'notion.token'),
        inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      },
    }),
  );
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 }, 'applied once the catalog is fixed');
  t.strictSame(readTokenFile(join(c.root, 'cli', 'notion.token')), { ok: true, token: cliBody.token });
});

// ───────────────────────────── session 10: the slot in force from memory, names given ─────────────────────────────

t.test('the slot in force is kept from what apply wrote, but a slot file someone else replaced is read again', async (t) => {
  const e = env();
  putBody(e.p, body({ tokenId: 'tok-1', credentialGeneration: 1 }));
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 });
  // Another writer (bind, an operator) replaces the slot file by rename: a higher generation.
  const slotPath = join(e.p.slots, `${SLOT}.json`);
  const planted: SlotFile = { slot: SLOT, tokenId: 'tok-9', expiresAt: '2030-01-01T14:00:00.000Z', generation: 9 };
  writeFileSync(`${slotPath}.other`, `${JSON.stringify(planted)}\n`);
  renameSync(`${slotPath}.other`, slotPath);
  putBody(e.p, body({ tokenId: 'tok-2', credentialGeneration: 2 }));
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 1, rejected: 0 }, 'compared with the file on disk, not with what apply wrote');
  t.equal(readFileSync(e.tokenFile, 'utf8'), 'gw_token-one-SECRET\n', 'the older token is not written');
  // Edited in place (same inode, other size): read again too.
  writeFileSync(slotPath, `${JSON.stringify({ ...planted, generation: 1, tokenId: 'tok-1', appliedAt: '2030-01-01T12:00:00.000Z' })}\n`);
  putBody(e.p, body({ tokenId: 'tok-3', credentialGeneration: 3, token: 'gw_token-three-SECRET' }));
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 }, 'newer than the edited file');
  t.equal(readFileSync(e.tokenFile, 'utf8'), 'gw_token-three-SECRET\n');
  t.match(slotJson(e.p), { tokenId: 'tok-3', generation: 3 });
});

t.test('nextNames: the names given are applied without listing inbox/; an empty list is a pass that does nothing', async (t) => {
  const rounds: Array<readonly string[] | 'list'> = [[`${SLOT}.json`], []];
  const e = env({
    nextNames: () => {
      const next = rounds.shift() ?? [];
      return next === 'list' ? undefined : next;
    },
  });
  putBody(e.p, body());
  putBody(e.p, body({ slot: 'instance:inst-2' }), 'instance:inst-2');
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 }, 'only the name given');
  t.strictSame(inboxNames(e.p), ['instance:inst-2.json'], 'the other one waits for its name or a listing');
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 0, rejected: 0 }, 'no names: nothing');
  t.notOk(existsSync(join(e.p.root, 'apply.lock')), 'no lock left');
  // A name whose file is gone (apply's own removal reported late) costs nothing.
  rounds.push([`${SLOT}.json`, 'instance:inst-2.json'], []);
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 });
  t.strictSame(inboxNames(e.p), []);
  // undefined: list the directory.
  putBody(e.p, body({ slot: 'instance:inst-3', tokenId: 'tok-3' }), 'instance:inst-3');
  rounds.push('list', []);
  t.strictSame(await applyInbox(e.deps), { applied: 1, ignored: 0, rejected: 0 });
});

t.test('a failed file is counted, so a watching apply lists the inbox again', async (t) => {
  const e = env({
    tokenFilesFor: async () => {
      throw new Error('registry invalid');
    },
  });
  putBody(e.p, body());
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 0, rejected: 0, failed: 1 });
  t.strictSame(inboxNames(e.p), [`${SLOT}.json`], 'left in place');
});

// ───────────────────────────── batches ─────────────────────────────

let batchSeq = 1_893_499_200_000_000;
/** Writes a batch file as the link does (temp, rename); names sort in the order written. */
function putBatch(p: HandoffPaths, entries: unknown[], raw?: string): string {
  batchSeq += 1;
  return putInbox(p, batchFileName(batchSeq, Math.random().toString(16).slice(2, 14).padEnd(12, '0')), raw ?? `${JSON.stringify({ v: 1, entries })}\n`);
}

/** One token file per slot, under the state's mcp-forwarder/ (as the §2 default). */
function perSlotEnv(overrides: Partial<ApplyDeps> = {}): Env & { tokenOf: (slot: string) => string } {
  const e = env();
  const tokenOf = (slot: string): string => join(e.root, 'state', 'mcp-forwarder', `${slot.slice(slot.indexOf(':') + 1)}.token`);
  e.deps = {
    ...e.deps,
    tokenFilesFor: async (slot) => {
      e.tokenCalls.push(slot);
      return [tokenOf(slot)];
    },
    ...overrides,
  };
  return { ...e, tokenOf };
}

const S = (i: number): string => `instance:inst-b${i}`;

t.test('a batch: every entry applied (token 0600 before its slot file), the batch removed', async (t) => {
  const e = perSlotEnv();
  const bodies = [1, 2, 3].map((i) => body({ slot: S(i), tokenId: `tok-b${i}`, token: `gw_batch-${i}-SECRET` }));
  putBatch(e.p, bodies);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 3, ignored: 0, rejected: 0 });
  for (const b of bodies) {
    t.strictSame(readTokenFile(e.tokenOf(b.slot)), { ok: true, token: b.token }, `${b.slot}: token written`);
    t.equal(modeOf(e.tokenOf(b.slot)), 0o600);
    t.match(slotJson(e.p, b.slot), { slot: b.slot, tokenId: b.tokenId, generation: 1, appliedAt: new Date(NOW).toISOString() });
  }
  t.strictSame(inboxNames(e.p), [], 'the batch is gone, no temp left');
  t.strictSame(readdirSync(dirname(e.tokenOf(S(1)))).filter((n) => n.startsWith('.')), [], 'no token temp left');
  t.notMatch(e.lines.join('\n'), /SECRET/, 'no token in any log line');
});

t.test('a bad entry is rejected alone, kept in rejected/ as its own file; the rest applied', async (t) => {
  const e = perSlotEnv();
  const good = body({ slot: S(1), token: 'gw_good-SECRET' });
  const bad = [
    { slot: S(2), tokenId: 'tok-x', token: 'gw_bad-SECRET', expiresAt: 'not a time', credentialGeneration: 1 },
    { ...body({ slot: S(3), token: 'gw_extra-SECRET' }), extra: 'field' },
    'a string',
  ];
  const batch = putBatch(e.p, [bad[0], good, bad[1], bad[2]]);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 1, ignored: 0, rejected: 3 });
  t.strictSame(readTokenFile(e.tokenOf(S(1))), { ok: true, token: good.token }, 'the good entry applied');
  t.notOk(existsSync(e.tokenOf(S(2))) || existsSync(e.tokenOf(S(3))), 'no bad entry written');
  t.notOk(existsSync(batch), 'the batch is removed');
  const rejected = readdirSync(e.p.rejected).sort();
  t.equal(rejected.length, 3, 'one file per bad entry');
  const kept = rejected.map((n) => JSON.parse(readFileSync(join(e.p.rejected, n), 'utf8')) as unknown);
  t.same(new Set(kept.map((k) => JSON.stringify(k))), new Set(bad.map((b) => JSON.stringify(b))), 'each kept as it was');
  for (const n of rejected) t.equal(modeOf(join(e.p.rejected, n)), 0o600, `${n} is apply's own, 0600`);
  const errors = e.records.filter((r) => r.msg === 'inbox batch entry rejected; kept in rejected/, the rest of the batch applied');
  t.strictSame(errors.map((r) => r.entry), [0, 2, 3], 'each logged with its index');
  t.notMatch(e.lines.join('\n'), /SECRET|not a time|a string/, 'no content in the log');

});

t.test('an unusable batch is moved aside whole: unparseable, wrong envelope, oversized, symlink, FIFO', async (t) => {
  const e = perSlotEnv();
  const names = [
    putBatch(e.p, [], '{"v":1,"entries":[{"slot":'),
    putBatch(e.p, [], `${JSON.stringify({ v: 2, entries: [body({ slot: S(1) })] })}\n`),
    putBatch(e.p, [], `${JSON.stringify({ v: 1, entries: [body({ slot: S(1) })], pad: 'x'.repeat(MAX_BATCH_FILE_BYTES) })}\n`),
  ];
  const target = join(e.root, 'elsewhere.json');
  writeFileSync(target, `${JSON.stringify({ v: 1, entries: [body({ slot: S(1) })] })}\n`);
  const link = join(e.p.inbox, batchFileName(batchSeq + 100, 'aaaaaaaaaaaa'));
  symlinkSync(target, link);
  const fifo = join(e.p.inbox, batchFileName(batchSeq + 101, 'bbbbbbbbbbbb'));
  execFileSync('mkfifo', [fifo]);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 0, ignored: 0, rejected: 5 });
  t.notOk(existsSync(e.tokenOf(S(1))), 'nothing applied');
  t.strictSame(inboxNames(e.p), [], 'all moved out of the inbox');
  t.equal(readdirSync(e.p.rejected).length, 5, 'all five in rejected/');
  t.ok(existsSync(target), "the symlink's target untouched");
  const reasons = e.records.filter((r) => r.msg === 'inbox batch rejected; moved aside, not applied').map((r) => String(r.reason));
  t.match(reasons.join('|'), /symlink/);
  t.match(reasons.join('|'), /not-regular/);
  t.match(reasons.join('|'), /too-large/);
  for (const n of names) t.notOk(existsSync(n));
});

t.test('a slot in two batches: applied in name order, isNewer decides', async (t) => {
  const e = perSlotEnv();
  const g2 = body({ slot: S(1), tokenId: 'tok-g2', token: 'gw_g2-SECRET', credentialGeneration: 2 });
  const g3 = body({ slot: S(1), tokenId: 'tok-g3', token: 'gw_g3-SECRET', credentialGeneration: 3 });
  const g1 = body({ slot: S(2), tokenId: 'tok-x1', token: 'gw_x1-SECRET', credentialGeneration: 1 });
  const g0 = body({ slot: S(2), tokenId: 'tok-x0', token: 'gw_x0-SECRET', credentialGeneration: 1, expiresAt: '2030-01-01T12:30:00.000Z' });
  putBatch(e.p, [g2, g1]);
  putBatch(e.p, [g3, g0]);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 3, ignored: 1, rejected: 0 }, 'the later, older answer ignored');
  t.strictSame(readTokenFile(e.tokenOf(S(1))), { ok: true, token: g3.token }, 'the newer of the two batches wins');
  t.strictSame(readTokenFile(e.tokenOf(S(2))), { ok: true, token: g1.token }, 'an older answer in a later batch does not');
  t.strictSame(inboxNames(e.p), []);
});

t.test('a slot twice in one batch: judged in the order written', async (t) => {
  const e = perSlotEnv();
  const a = body({ slot: S(1), tokenId: 'tok-a', token: 'gw_a-SECRET', credentialGeneration: 1 });
  const b = body({ slot: S(1), tokenId: 'tok-b', token: 'gw_b-SECRET', credentialGeneration: 2 });
  const older = body({ slot: S(2), tokenId: 'tok-o', token: 'gw_o-SECRET', credentialGeneration: 1 });
  const newer = body({ slot: S(2), tokenId: 'tok-n', token: 'gw_n-SECRET', credentialGeneration: 2 });
  putBatch(e.p, [a, newer, b, older]);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 3, ignored: 1, rejected: 0 });
  t.strictSame(readTokenFile(e.tokenOf(S(1))), { ok: true, token: b.token });
  t.strictSame(readTokenFile(e.tokenOf(S(2))), { ok: true, token: newer.token });
});

t.test('upgrade: per-slot files a previous link left and new batches in one inbox, all applied, newest wins', async (t) => {
  const e = perSlotEnv();
  // S(1): the per-slot file is newer; S(2): the batch is newer; S(3), S(4): one of each alone.
  putBody(e.p, body({ slot: S(1), tokenId: 'tok-f1', token: 'gw_f1-SECRET', credentialGeneration: 5 }), S(1));
  putBody(e.p, body({ slot: S(2), tokenId: 'tok-f2', token: 'gw_f2-SECRET', credentialGeneration: 1 }), S(2));
  putBody(e.p, body({ slot: S(3), tokenId: 'tok-f3', token: 'gw_f3-SECRET' }), S(3));
  putBatch(e.p, [
    body({ slot: S(1), tokenId: 'tok-b1', token: 'gw_b1-SECRET', credentialGeneration: 4 }),
    body({ slot: S(2), tokenId: 'tok-b2', token: 'gw_b2-SECRET', credentialGeneration: 2 }),
    body({ slot: S(4), tokenId: 'tok-b4', token: 'gw_b4-SECRET' }),
  ]);
  const stats = await applyInbox(e.deps);
  t.equal(stats.applied + stats.ignored, 6, 'every answer looked at');
  t.equal(stats.rejected, 0);
  t.strictSame(
    [1, 2, 3, 4].map((i) => readTokenFile(e.tokenOf(S(i)))),
    ['gw_f1-SECRET', 'gw_b2-SECRET', 'gw_f3-SECRET', 'gw_b4-SECRET'].map((token) => ({ ok: true, token })),
    'each slot holds its newest token, whichever file brought it',
  );
  t.strictSame([1, 2, 3, 4].map((i) => (slotJson(e.p, S(i)) as SlotFile).tokenId), ['tok-f1', 'tok-b2', 'tok-f3', 'tok-b4']);
  t.strictSame(inboxNames(e.p), [], 'the inbox drained, both kinds');
});

t.test('a batch on a managed host: a slot not in force dropped; a revocation deletes the token file', async (t) => {
  const e = perSlotEnv({ managed: true });
  mkdirSync(e.p.slots, { recursive: true });
  // S(1) in force with a token; S(2) in force, no token yet; S(3) not in force.
  putBatch(e.p, [body({ slot: S(1), tokenId: 'tok-1', token: 'gw_one-SECRET' })]);
  writeFileSync(join(e.p.slots, `${S(1)}.json`), `${JSON.stringify(emptySlotFile(S(1)))}\n`);
  writeFileSync(join(e.p.slots, `${S(2)}.json`), `${JSON.stringify(emptySlotFile(S(2)))}\n`);
  t.equal((await applyInbox(e.deps)).applied, 1);
  t.ok(existsSync(e.tokenOf(S(1))));
  putBatch(e.p, [
    { slot: S(1), revoked: true, at: new Date(NOW).toISOString() },
    body({ slot: S(2), tokenId: 'tok-2', token: 'gw_two-SECRET' }),
    body({ slot: S(3), tokenId: 'tok-3', token: 'gw_three-SECRET' }),
  ]);
  const stats = await applyInbox(e.deps);
  t.strictSame(stats, { applied: 2, ignored: 1, rejected: 0 });
  t.notOk(existsSync(e.tokenOf(S(1))), 'the revoked slot has no token file');
  t.match(slotJson(e.p, S(1)), { slot: S(1), revoked: true });
  t.strictSame(readTokenFile(e.tokenOf(S(2))), { ok: true, token: 'gw_two-SECRET' });
  t.notOk(existsSync(e.tokenOf(S(3))), 'the slot not in force got nothing');
  t.notOk(existsSync(join(e.p.slots, `${S(3)}.json`)), 'nor a slot file');
  t.strictSame(inboxNames(e.p), []);
});

t.test('a new desired state interrupts between waves; nothing of the waiting wave is written, the batches stay', async (t) => {
  let asked = 0;
  const e = perSlotEnv({ interrupt: () => ++asked > 2 });
  // Applied together: wave 1 holds S(1)'s first answer and S(2); wave 2 S(1)'s second.
  const first = putBatch(e.p, [body({ slot: S(1), tokenId: 'tok-1a', token: 'gw_first-SECRET' })]);
  const second = putBatch(e.p, [body({ slot: S(1), tokenId: 'tok-1b', token: 'gw_newer-SECRET', credentialGeneration: 2 }), body({ slot: S(2), token: 'gw_second-SECRET' })]);
  const stats = await applyInbox(e.deps);
  t.equal(stats.interrupted, true);
  t.strictSame(readTokenFile(e.tokenOf(S(1))), { ok: true, token: 'gw_first-SECRET' }, 'the first wave applied');
  t.ok(existsSync(e.tokenOf(S(2))), 'S(2) with it');
  t.ok(existsSync(first) && existsSync(second), 'both batches left in the inbox for the next pass');
  const again = await applyInbox({ ...e.deps, interrupt: () => false });
  t.strictSame(again, { applied: 1, ignored: 2, rejected: 0 }, 'the next pass: what was written is not newer, the rest applied');
  t.strictSame(readTokenFile(e.tokenOf(S(1))), { ok: true, token: 'gw_newer-SECRET' });
  t.strictSame(inboxNames(e.p), []);
});

t.test('a batch whose token write fails stays whole for the next pass; applying it again is idempotent', async (t) => {
  const e = perSlotEnv();
  const bodies = [1, 2].map((i) => body({ slot: S(i), tokenId: `tok-${i}`, token: `gw_${i}-SECRET` }));
  // S(2)'s token file is a directory: refused (not a regular file), the batch fails.
  mkdirSync(e.tokenOf(S(2)), { recursive: true });
  const batch = putBatch(e.p, bodies);
  const stats = await applyInbox(e.deps);
  t.equal(stats.failed, 1, 'counted failed');
  t.ok(existsSync(batch), 'the batch stays');
  t.notOk(existsSync(e.tokenOf(S(1))), 'nothing of the wave renamed in (tokens staged together)');
  t.strictSame(readdirSync(dirname(e.tokenOf(S(1)))).filter((n) => n.startsWith('.')), [], 'no temp left');
  rmSync(e.tokenOf(S(2)), { recursive: true });
  const again = await applyInbox(e.deps);
  t.strictSame(again, { applied: 2, ignored: 0, rejected: 0 });
  t.strictSame(inboxNames(e.p), []);
  // The same batch again (a crash before its removal): every entry not newer, nothing rewritten.
  const before = statSync(e.tokenOf(S(1))).ino;
  putBatch(e.p, bodies);
  t.strictSame(await applyInbox(e.deps), { applied: 0, ignored: 2, rejected: 0 });
  t.equal(statSync(e.tokenOf(S(1))).ino, before, 'the token file untouched');
});
