import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import {
  batchFileName,
  emptySlotFile,
  handoffPaths,
  inboxBatchSchema,
  inboxFileSchema,
  isBatchFileName,
  MAX_BATCH_ENTRIES,
  MAX_MANIFEST_BYTES,
  MAX_MANIFEST_SLOTS,
  parseSlotManifest,
  readSlotFile,
  readSlots,
  slotFileName,
  slotFileSchema,
  slotIdsInHandoff,
  SLOT_MANIFEST_FILE,
  slotManifestText,
  slotOfFileName,
  type HandoffPaths,
} from '../../src/data/handoff.js';
import { tempDir } from '../support/temp-dir.js';

function handoff(): HandoffPaths {
  return handoffPaths(tempDir('ac-handoff-', t));
}

const OK_BODY = {
  slot: 'instance:inst-1',
  tokenId: 'tok_01',
  token: 'gw_secret-token-value',
  expiresAt: '2030-01-01T12:00:00.000Z',
  credentialGeneration: 3,
};

t.test('handoffPaths: slots, inbox, rejected and the desired state under the root', async (t) => {
  t.strictSame(handoffPaths('/h'), { root: '/h', slots: '/h/slots', inbox: '/h/inbox', rejected: '/h/rejected', desiredState: '/h/desired-state.json' });
});

t.test('slotFileName / slotOfFileName: the colon is kept as is', async (t) => {
  t.equal(slotFileName('instance:inst-1'), 'instance:inst-1.json');
  t.equal(slotFileName('cli:notion'), 'cli:notion.json');
  t.equal(slotOfFileName('instance:inst-1.json'), 'instance:inst-1');
  t.equal(slotOfFileName('cli:notion.json'), 'cli:notion');
  t.equal(slotOfFileName('cli:a.b.json'), 'cli:a.b', 'dots in the id are fine');
  t.equal(slotOfFileName(`instance:${'a'.repeat(128)}.json`), `instance:${'a'.repeat(128)}`);
  for (const slot of ['instance:x', 'cli:y_z-1', 'instance:A.B']) t.equal(slotOfFileName(slotFileName(slot)), slot, `round trip ${slot}`);
});

t.test('slotOfFileName: temp dotfiles, non-json and invalid slot ids → undefined', async (t) => {
  for (const name of [
    '.instance:inst-1.json', // a writer's temp file
    '.instance:inst-1.json.tmp-1234',
    '.cli:notion.json.1a2b3c',
    'instance:inst-1.json.tmp',
    'instance:inst-1',
    'instance:inst-1.JSON',
    'instance:inst-1.json~',
    'instance:inst-1.json.12345.rejected',
    '.json',
    'inst-1.json', // no kind
    'forwarder:inst-1.json', // unknown kind
    'instance:.json', // empty id
    'instance-inst-1.json', // no colon
    'instance%3Ainst-1.json', // encoded colon is not how we name files
    'instance:in st.json',
    'instance:a:b.json',
    `instance:${'a'.repeat(129)}.json`,
    '',
  ]) {
    t.equal(slotOfFileName(name), undefined, JSON.stringify(name));
  }
});

t.test('inboxFileSchema: a 200 body', async (t) => {
  const r = inboxFileSchema.safeParse(OK_BODY);
  t.ok(r.success);
  t.strictSame(r.data, OK_BODY);
});

t.test('inboxFileSchema: a revocation notice', async (t) => {
  const notice = { slot: 'cli:notion', revoked: true, at: '2030-01-01T12:00:00Z' };
  const r = inboxFileSchema.safeParse(notice);
  t.ok(r.success);
  t.strictSame(r.data, notice);
  t.notOk(inboxFileSchema.safeParse({ ...notice, revoked: false }).success, 'revoked must be true');
  t.notOk(inboxFileSchema.safeParse({ slot: 'cli:notion', revoked: true }).success, 'at is required');
  t.notOk(inboxFileSchema.safeParse({ ...notice, at: 'yesterday' }).success, 'at is RFC 3339');
  t.notOk(inboxFileSchema.safeParse({ ...notice, slot: 'notion' }).success, 'slot is a slot id');
});

t.test('inboxFileSchema: rejects extra keys (strict, unlike the wire answer)', async (t) => {
  t.notOk(inboxFileSchema.safeParse({ ...OK_BODY, extra: 1 }).success, '200 body + extra key');
  t.notOk(inboxFileSchema.safeParse({ slot: 'cli:notion', revoked: true, at: '2030-01-01T12:00:00Z', token: 'x' }).success, 'notice + extra key');
  t.notOk(inboxFileSchema.safeParse({ ...OK_BODY, revoked: true, at: '2030-01-01T12:00:00Z' }).success, 'a mix of both');
});

t.test('inboxFileSchema: rejects bad tokens and bad fields', async (t) => {
  const bad: Array<[string, Record<string, unknown>]> = [
    ['empty token', { token: '' }],
    ['token with a space', { token: 'abc def' }],
    ['token with a newline', { token: 'abc\ndef' }],
    ['token with CR', { token: 'abc\r' }],
    ['token with a tab', { token: '\tabc' }],
    ['non-ASCII token', { token: 'abcé' }],
    ['token over 16 KiB', { token: 'a'.repeat(16 * 1024 + 1) }],
    ['token not a string', { token: 42 }],
    ['tokenId with a space', { tokenId: 'a b' }],
    ['empty tokenId', { tokenId: '' }],
    ['negative generation', { credentialGeneration: -1 }],
    ['fractional generation', { credentialGeneration: 1.5 }],
    ['generation as string', { credentialGeneration: '3' }],
    ['local time', { expiresAt: '2030-01-01T12:00:00' }],
    ['not a date', { expiresAt: 'tomorrow' }],
    ['bad slot', { slot: 'instance:a/b' }],
  ];
  for (const [what, patch] of bad) t.notOk(inboxFileSchema.safeParse({ ...OK_BODY, ...patch }).success, what);
  t.ok(inboxFileSchema.safeParse({ ...OK_BODY, token: 'a'.repeat(16 * 1024) }).success, 'exactly 16 KiB is fine');
  for (const key of Object.keys(OK_BODY)) {
    const partial: Record<string, unknown> = { ...OK_BODY };
    delete partial[key];
    t.notOk(inboxFileSchema.safeParse(partial).success, `missing ${key}`);
  }
});

t.test('slotFileSchema: null token for a fresh slot, our extensions optional', async (t) => {
  t.ok(slotFileSchema.safeParse(emptySlotFile('instance:a')).success);
  t.strictSame(emptySlotFile('cli:x'), { slot: 'cli:x', tokenId: null, expiresAt: null, generation: 0 });
  t.ok(slotFileSchema.safeParse({ slot: 'cli:x', tokenId: 't', expiresAt: '2030-01-01T00:00:00Z', generation: 1, appliedAt: '2030-01-01T00:00:00Z', revoked: true }).success);
  t.notOk(slotFileSchema.safeParse({ ...emptySlotFile('cli:x'), token: 'secret' }).success, 'a slot file never carries a token');
});

t.test('readSlots: no slots directory → nothing, no error', async (t) => {
  const p = handoff();
  t.strictSame(await readSlots(p), { slots: [], errors: [] });
});

t.test('readSlots: reads valid slot files, sorted, and ignores non-slot names silently', async (t) => {
  const p = handoff();
  mkdirSync(p.slots, { recursive: true });
  const a = { slot: 'instance:a', tokenId: 'tok-a', expiresAt: '2030-01-01T00:00:00.000Z', generation: 2, appliedAt: '2029-12-31T23:00:00.000Z' };
  const b = emptySlotFile('cli:notion');
  writeFileSync(join(p.slots, 'instance:a.json'), JSON.stringify(a));
  writeFileSync(join(p.slots, 'cli:notion.json'), `${JSON.stringify(b)}\n`);
  writeFileSync(join(p.slots, '.instance:b.json.tmp-99'), 'half a fi');
  writeFileSync(join(p.slots, 'README'), 'not a slot');
  writeFileSync(join(p.slots, 'notaslot.json'), '{}');
  mkdirSync(join(p.slots, 'instance:dir.json'));
  const r = await readSlots(p);
  t.strictSame(r.slots, [b, a], 'both slots, in file name order');
  t.strictSame(r.errors, [], 'temp files, junk names and a directory are not errors');
});

t.test('readSlots: invalid files are skipped and reported without their content', async (t) => {
  const p = handoff();
  mkdirSync(p.slots, { recursive: true });
  const SECRET = 'SECRET-a1b2c3d4e5';
  const good = emptySlotFile('instance:good');
  writeFileSync(join(p.slots, 'instance:good.json'), JSON.stringify(good));
  writeFileSync(join(p.slots, 'instance:json.json'), `{"slot":"instance:json","tokenId":"${SECRET}`);
  writeFileSync(join(p.slots, 'instance:extra.json'), JSON.stringify({ ...emptySlotFile('instance:extra'), [SECRET]: SECRET }));
  writeFileSync(join(p.slots, 'instance:tok.json'), JSON.stringify({ ...emptySlotFile('instance:tok'), tokenId: `${SECRET} x` }));
  writeFileSync(join(p.slots, 'instance:gen.json'), JSON.stringify({ ...emptySlotFile('instance:gen'), generation: SECRET }));
  writeFileSync(join(p.slots, 'instance:empty.json'), '');
  const r = await readSlots(p);
  t.strictSame(r.slots, [good], 'only the valid slot is returned');
  t.strictSame(
    r.errors.map((e) => e.file),
    ['instance:empty.json', 'instance:extra.json', 'instance:gen.json', 'instance:json.json', 'instance:tok.json'],
    'every invalid file is reported by name',
  );
  for (const e of r.errors) {
    t.type(e.error, 'string');
    t.ok(e.error.length > 0, `${e.file}: has a reason`);
    t.notMatch(e.error, SECRET, `${e.file}: the reason does not quote the content (${e.error})`);
    t.notMatch(e.error, 'a1b2c3', `${e.file}: not even a fragment of it`);
  }
  t.equal(r.errors.find((e) => e.file === 'instance:json.json')?.error, 'invalid JSON');
});

t.test('readSlots: a slot field that does not match the file name is reported', async (t) => {
  const p = handoff();
  mkdirSync(p.slots, { recursive: true });
  writeFileSync(join(p.slots, 'instance:a.json'), JSON.stringify(emptySlotFile('instance:b')));
  writeFileSync(join(p.slots, 'cli:x.json'), JSON.stringify(emptySlotFile('instance:x')));
  const r = await readSlots(p);
  t.strictSame(r.slots, []);
  t.strictSame(r.errors, [
    { file: 'cli:x.json', error: 'slot field does not match the file name' },
    { file: 'instance:a.json', error: 'slot field does not match the file name' },
  ]);
});

t.test('readSlotFile: the slot, or undefined when missing or invalid', async (t) => {
  const p = handoff();
  t.equal(await readSlotFile(p, 'instance:a'), undefined, 'no directory');
  mkdirSync(p.slots, { recursive: true });
  t.equal(await readSlotFile(p, 'instance:a'), undefined, 'no file');
  const a = { slot: 'instance:a', tokenId: 'tok', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 };
  writeFileSync(join(p.slots, 'instance:a.json'), JSON.stringify(a));
  t.strictSame(await readSlotFile(p, 'instance:a'), a);
  writeFileSync(join(p.slots, 'instance:b.json'), '{"slot":');
  t.equal(await readSlotFile(p, 'instance:b'), undefined, 'invalid JSON');
});

t.test('batch file names: never a slot file, sortable by sequence, strict', async (t) => {
  const name = batchFileName(1_893_499_200_000_000, '0123456789ab');
  t.equal(name, 'batch-1893499200000000-0123456789ab.json');
  t.ok(isBatchFileName(name));
  t.equal(slotOfFileName(name), undefined, 'not a slot id (no kind: prefix)');
  t.ok(batchFileName(99, 'aaaaaaaaaaaa') < batchFileName(100, '000000000000'), 'zero-padded: sorts by sequence');
  for (const bad of ['batch-1-0123456789ab.json', `${name}.tmp`, `.${name}`, 'batch-1893499200000000-0123456789AB.json', 'instance:x.json']) {
    t.notOk(isBatchFileName(bad), `${bad} is not a batch name`);
  }
});

t.test('inboxBatchSchema: the envelope only (entries checked one by one by apply), bounded', async (t) => {
  t.ok(inboxBatchSchema.safeParse({ v: 1, entries: [OK_BODY, { junk: true }] }).success, 'a bad entry does not fail the envelope');
  t.notOk(inboxBatchSchema.safeParse({ v: 2, entries: [OK_BODY] }).success, 'an unknown version');
  t.notOk(inboxBatchSchema.safeParse({ v: 1, entries: [] }).success, 'no entries');
  t.notOk(inboxBatchSchema.safeParse({ v: 1, entries: [OK_BODY], extra: 1 }).success, 'an unknown key');
  t.notOk(inboxBatchSchema.safeParse({ v: 1, entries: Array.from({ length: MAX_BATCH_ENTRIES + 1 }, () => OK_BODY) }).success, 'past the entry bound');
  t.notOk(inboxBatchSchema.safeParse(OK_BODY).success, 'a per-slot body is not a batch');
});

t.test('the slot manifest: its name is never a slot file\'s; the union of its ids and the per-slot files, a file winning', async (t) => {
  t.equal(slotOfFileName(SLOT_MANIFEST_FILE), undefined, 'never parsed as a slot file name');
  const paths = handoffPaths(tempDir('ac-manifest-', t));
  mkdirSync(paths.slots, { recursive: true });
  const manifest = (slots: string[]): void => writeFileSync(join(paths.slots, SLOT_MANIFEST_FILE), slotManifestText(slots, 3));
  // Manifest only.
  manifest(['instance:a', 'cli:gh']);
  t.strictSame(await readSlots(paths), { slots: [emptySlotFile('cli:gh'), emptySlotFile('instance:a')], errors: [] }, 'manifest only: empty slots');
  // Both: a file wins over its entry; a file alone is a slot too.
  const held = { slot: 'instance:a', tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 };
  writeFileSync(join(paths.slots, slotFileName('instance:a')), JSON.stringify(held));
  writeFileSync(join(paths.slots, slotFileName('instance:b')), JSON.stringify(emptySlotFile('instance:b')));
  t.strictSame((await readSlots(paths)).slots, [emptySlotFile('cli:gh'), held, emptySlotFile('instance:b')], 'both: the file wins');
  t.strictSame([...(await slotIdsInHandoff(paths)).ids].sort(), ['cli:gh', 'instance:a', 'instance:b']);
  // Files only.
  rmSync(join(paths.slots, SLOT_MANIFEST_FILE));
  t.strictSame((await readSlots(paths)).slots, [held, emptySlotFile('instance:b')], 'files only');
  // An invalid file named in the manifest: the file wins, as an error.
  manifest(['instance:c']);
  writeFileSync(join(paths.slots, slotFileName('instance:c')), '{nope');
  const r = await readSlots(paths);
  t.notOk(r.slots.some((s) => s.slot === 'instance:c'), 'an invalid file is no slot, whatever the manifest says');
  t.same(r.errors.map((e) => e.file), [slotFileName('instance:c')]);
});

t.test('the slot manifest is hostile input: bad, huge, symlinked, a FIFO, a duplicate id → a clear error, the files still read', async (t) => {
  const paths = handoffPaths(tempDir('ac-manifest-bad-', t));
  mkdirSync(paths.slots, { recursive: true });
  const path = join(paths.slots, SLOT_MANIFEST_FILE);
  writeFileSync(join(paths.slots, slotFileName('instance:b')), JSON.stringify(emptySlotFile('instance:b')));
  const check = async (what: string, error: RegExp): Promise<void> => {
    const r = await readSlots(paths);
    t.same(r.slots.map((s) => s.slot), ['instance:b'], `${what}: the files still read`);
    t.equal(r.errors.length, 1, `${what}: one error`);
    t.equal(r.errors[0]?.file, SLOT_MANIFEST_FILE);
    t.match(r.errors[0]?.error, error, `${what}: says why`);
    t.equal((await slotIdsInHandoff(paths)).manifest, 'invalid');
  };
  writeFileSync(path, '{"v":1,"slots":["instance:a","../x"]}');
  await check('a bad id', /slot/);
  writeFileSync(path, '{"v":2,"slots":[]}');
  await check('another version', /v/);
  writeFileSync(path, '{"v":1,"slots":["instance:a","instance:a"]}');
  await check('a duplicate id', /duplicate/);
  writeFileSync(path, 'x'.repeat(MAX_MANIFEST_BYTES + 1));
  await check('huge', /larger than/);
  rmSync(path);
  const target = join(tempDir('ac-manifest-target-', t), 'm');
  writeFileSync(target, slotManifestText(['instance:a']));
  symlinkSync(target, path);
  await check('a symlink', /symlink/);
  rmSync(path);
  execFileSync('mkfifo', [path]);
  await check('a FIFO', /not a regular file/);
  t.ok(parseSlotManifest(slotManifestText(['instance:a'])).ok);
  t.strictSame(parseSlotManifest(JSON.stringify({ v: 1, slots: Array.from({ length: MAX_MANIFEST_SLOTS + 1 }, (_, i) => `instance:i${i}`) })).ok, false, 'more ids than the bound');
});
