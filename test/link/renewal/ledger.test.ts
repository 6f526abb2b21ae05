import { randomUUID } from 'node:crypto';
import { appendFileSync, mkdirSync, readdirSync, readFileSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { Ledger, MAX_LINE_BYTES, SNAPSHOT_NAME, logName } from '../../../src/link/renewal/ledger.js';
import { forgottenSchema, renewalSlotStateSchema, type RenewalSlotState } from '../../../src/link/renewal/record-schema.js';
import { RenewalState } from '../../../src/link/renewal/renewal-state.js';
import { tempDir } from '../../support/temp-dir.js';

const since = '2030-01-01T12:00:00.000Z';
const later = '2030-01-01T12:00:05.000Z';
const pendingOf = (slot: string): RenewalSlotState => ({ slot, pending: { requestId: randomUUID(), expectedTokenId: null, since } });
const deliveredOf = (slot: string, n = 1): RenewalSlotState => ({
  slot,
  delivered: { tokenId: `tok_${n}`, expiresAt: '2030-01-01T18:00:00.000Z', generation: n, receivedAt: later },
});

const ledger = (dir: string, options: { compactFloorBytes?: number; compactFactor?: number } = {}): Ledger<RenewalSlotState> =>
  new Ledger(dir, renewalSlotStateSchema, forgottenSchema, options);

const files = (dir: string): string[] => readdirSync(dir).filter((n) => !n.startsWith('.')).sort();
const onDisk = (dir: string): Record<string, RenewalSlotState> => Object.fromEntries(RenewalState.readRecords(dir));

t.test('records survive a restart: set, changed, forgotten; the files are 0600; one log line per change', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const state = new RenewalState(dir);
  const a = pendingOf('instance:a');
  const b = pendingOf('instance:b');
  await Promise.all([state.write(a), state.write(b), state.write(pendingOf('instance:c'))]);
  await state.write(deliveredOf('instance:a'));
  await state.forget('instance:c');
  t.same(files(dir), [logName(1)], 'one log, no snapshot yet, no per-slot file');
  t.equal(statSync(join(dir, logName(1))).mode & 0o777, 0o600);
  t.equal(readFileSync(join(dir, logName(1)), 'utf8').split('\n').filter(Boolean).length, 5, 'five changes, five lines');

  const after = new RenewalState(dir);
  const rec = after.recover();
  t.same({ records: rec.records, skipped: rec.skipped, torn: rec.torn, upgradedFiles: rec.upgradedFiles }, { records: 2, skipped: 0, torn: false, upgradedFiles: 0 });
  t.same(after.readSync('instance:a'), deliveredOf('instance:a'));
  t.same(after.readSync('instance:b'), b, 'the pending requestId, as written');
  t.same(after.readSync('instance:c'), { slot: 'instance:c' }, 'forgotten stays forgotten');
  t.same((await after.recorded()).sort(), ['instance:a', 'instance:b']);
});

t.test('changes made together go out together, and each resolves: a pending only once it is synced', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const state = new RenewalState(dir);
  const slots = Array.from({ length: 200 }, (_, i) => `instance:s${i}`);
  await Promise.all(slots.map((s) => state.write(pendingOf(s))));
  t.equal(Object.keys(onDisk(dir)).length, 200, 'every record on disk');
  await Promise.all(slots.map((s) => state.write(deliveredOf(s))));
  t.same(Object.values(onDisk(dir)).filter((r) => r.pending).length, 0, 'every pending settled on disk');
});

t.test('a torn last line (a crash mid-append) is ignored and cut off; the next line reads whole', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const before = new RenewalState(dir);
  const a = pendingOf('instance:a');
  await before.write(a);
  appendFileSync(join(dir, logName(1)), JSON.stringify(deliveredOf('instance:a')).slice(0, 40));
  const after = new RenewalState(dir);
  const rec = after.recover();
  t.equal(rec.torn, true, 'reported');
  t.equal(rec.skipped, 0, 'a torn tail is not a corrupt line');
  t.same(after.readSync('instance:a'), a, 'the state before the torn append: its pending requestId is reused');
  await after.write(deliveredOf('instance:a', 2));
  t.same(onDisk(dir)['instance:a'], deliveredOf('instance:a', 2), 'the next line is whole');
  t.ok(readFileSync(join(dir, logName(1)), 'utf8').split('\n').every((l) => l === '' || JSON.parse(l)), 'no fragment left in the log');
});

t.test('a corrupt or overlong line anywhere is skipped; the lines around it count', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const a = pendingOf('instance:a');
  const b = pendingOf('instance:b');
  writeFileSync(
    join(dir, logName(1)),
    [JSON.stringify(a), 'not json', JSON.stringify({ slot: 'instance:x', weird: 1 }), `{"slot":"instance:b","pad":"${'x'.repeat(MAX_LINE_BYTES + 10)}"}`, JSON.stringify(b), ''].join('\n'),
  );
  const state = new RenewalState(dir);
  const rec = state.recover();
  t.equal(rec.skipped, 3, 'three lines skipped');
  t.same(state.readSync('instance:a'), a);
  t.same(state.readSync('instance:b'), b);
  t.same(state.readSync('instance:x'), { slot: 'instance:x' }, 'an unknown shape is a fresh slot: worst case one extra renewal');
});

t.test('compaction: a snapshot and a new log; a restart reads the same records', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const l = ledger(dir, { compactFloorBytes: 4096, compactFactor: 2 });
  l.open();
  const slots = Array.from({ length: 20 }, (_, i) => `instance:s${i}`);
  const want = new Map<string, RenewalSlotState>();
  for (let round = 1; round <= 10; round++) {
    await Promise.all(
      slots.map((s) => {
        const r = round % 2 === 0 ? deliveredOf(s, round) : pendingOf(s);
        want.set(s, r);
        return l.set(r, r.pending !== undefined);
      }),
    );
    await l.settled();
  }
  await l.delete('instance:s0');
  want.delete('instance:s0');
  await l.settled();
  const names = files(dir);
  t.ok(names.includes(SNAPSHOT_NAME), 'a snapshot was written');
  t.equal(names.filter((n) => n.startsWith('ledger-')).length, 1, 'one log left');
  t.not(names.find((n) => n.startsWith('ledger-')), logName(1), 'a newer one');
  const header = JSON.parse(readFileSync(join(dir, SNAPSHOT_NAME), 'utf8').split('\n')[0] ?? '') as { v: number; log: number };
  t.equal(logName(header.log), names.find((n) => n.startsWith('ledger-')), "the snapshot names the log that follows it");
  t.same(onDisk(dir), Object.fromEntries(want), 'snapshot + log = every change');
  const size = statSync(join(dir, logName(header.log))).size;
  t.ok(size < 4096 * 3, 'the log did not keep growing');
});

t.test('a compaction cut before its snapshot was renamed: the previous snapshot, its log and the new log are read in order', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const a1 = pendingOf('instance:a');
  const b = pendingOf('instance:b');
  const a2 = pendingOf('instance:a');
  writeFileSync(join(dir, SNAPSHOT_NAME), `${JSON.stringify({ v: 1, log: 3 })}\n${JSON.stringify(deliveredOf('instance:a'))}\n${JSON.stringify(deliveredOf('instance:c'))}\n`);
  writeFileSync(join(dir, logName(2)), `${JSON.stringify(pendingOf('instance:z'))}\n`); // older than the snapshot: gone
  writeFileSync(join(dir, logName(3)), `${JSON.stringify(a1)}\n${JSON.stringify(b)}\n`);
  writeFileSync(join(dir, logName(4)), `${JSON.stringify(a2)}\n${JSON.stringify({ slot: 'instance:c', forgotten: true })}\n`);
  const state = new RenewalState(dir);
  state.recover();
  t.same(Object.fromEntries((await state.recorded()).sort().map((s) => [s, state.readSync(s)])), { 'instance:a': a2, 'instance:b': b }, 'the last line of each slot wins; forgotten stays forgotten');
  t.same(files(dir), [logName(3), logName(4), SNAPSHOT_NAME], 'the log older than the snapshot is removed; the others stay until the next compaction');
  await state.write(deliveredOf('instance:b'));
  t.same(onDisk(dir)['instance:b'], deliveredOf('instance:b'), 'appended to the newest log');
  t.match(readFileSync(join(dir, logName(4)), 'utf8'), /tok_1/);
});

t.test('upgrade: per-slot records and journal batches are folded into the ledger, durably, then removed', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const keptPending = pendingOf('instance:kept');
  const lost = pendingOf('instance:lost');
  const settledEntry = pendingOf('instance:settled');
  const adoptedEntry = pendingOf('instance:adopted');
  const forgotten = pendingOf('instance:forgotten');
  const record = (s: RenewalSlotState): void => writeFileSync(join(dir, `${s.slot}.json`), `${JSON.stringify(s)}\n`);
  record(keptPending);
  // What a power cut within the writeback delay could leave: the record without its pending
  // requestId, which the fsynced journal still held.
  record({ slot: 'instance:lost' });
  record({ slot: 'instance:settled', delivered: { tokenId: 'tok_1', expiresAt: later, generation: 1, receivedAt: later } });
  record({ slot: 'instance:adopted', adopted: 'tok_9' });
  record(deliveredOf('instance:plain'));
  writeFileSync(join(dir, 'instance:broken.json'), '{"slot":');
  const entry = (s: RenewalSlotState): string => `${JSON.stringify({ slot: s.slot, ...s.pending })}\n`;
  writeFileSync(join(dir, 'pending-3.journal'), entry(keptPending) + entry(lost) + 'not json\n');
  writeFileSync(join(dir, 'pending-7.journal'), entry(settledEntry) + entry(adoptedEntry) + entry(forgotten));

  const state = new RenewalState(dir);
  const rec = state.recover();
  t.equal(rec.upgradedFiles, 8, 'six records and two batches');
  t.same(rec.restored, ['instance:lost'], 'only the lost pending is put back');
  t.same(files(dir), [logName(1), SNAPSHOT_NAME], 'only the ledger is left');
  const want = {
    'instance:adopted': { slot: 'instance:adopted', adopted: 'tok_9' },
    'instance:broken': { slot: 'instance:broken' },
    'instance:kept': keptPending,
    'instance:lost': lost,
    'instance:plain': deliveredOf('instance:plain'),
    'instance:settled': { slot: 'instance:settled', delivered: { tokenId: 'tok_1', expiresAt: later, generation: 1, receivedAt: later } },
  };
  t.same(onDisk(dir), want, 'in the snapshot, before the old files went');
  t.equal(statSync(join(dir, SNAPSHOT_NAME)).mode & 0o777, 0o600);

  // Files an interrupted upgrade left beside the ledger are not read again (the ledger may be newer).
  await state.write(deliveredOf('instance:kept', 5));
  record(keptPending);
  const again = new RenewalState(dir);
  const rec2 = again.recover();
  t.equal(rec2.upgradedFiles, 0);
  t.same(again.readSync('instance:kept'), deliveredOf('instance:kept', 5), 'the ledger wins');
  t.same(files(dir), [logName(1), SNAPSHOT_NAME], 'the leftover removed');
});

t.test('the ledger is opened on first use without recover() (tests, tools)', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  const state = new RenewalState(dir);
  t.same(await state.read('instance:a'), { slot: 'instance:a' });
  await state.write(pendingOf('instance:a'));
  t.ok(onDisk(dir)['instance:a']?.pending);
});

t.test('opening a ledger in a missing directory fails; so does every write to it', async (t) => {
  const dir = join(tempDir('ac-ledger-', t), 'gone');
  const state = new RenewalState(dir);
  await t.rejects(state.write(pendingOf('instance:a')), { code: 'ENOENT' });
});

t.test('a compaction that cannot write its snapshot: appends go on in the new log, nothing is lost across a restart', async (t) => {
  const dir = tempDir('ac-ledger-', t);
  // The snapshot's name taken by a directory: atomicWrite refuses to replace it.
  mkdirSync(join(dir, SNAPSHOT_NAME));
  const errors: unknown[] = [];
  const l = new Ledger(dir, renewalSlotStateSchema, forgottenSchema, { compactFloorBytes: 0, compactFactor: 1, onCompactError: (err) => errors.push(err) });
  l.open();
  const a = pendingOf('instance:a');
  await l.set(a, true);
  await l.set(deliveredOf('instance:a'), false);
  await l.settled();
  t.equal(errors.length, 1, 'the failure was reported');
  t.same(files(dir), [logName(1), logName(2), SNAPSHOT_NAME], 'the old log stays beside the new one');
  const b = pendingOf('instance:b');
  await l.set(b, true);
  rmdirSync(join(dir, SNAPSHOT_NAME));
  const again = ledger(dir);
  again.open();
  t.same(again.get('instance:a'), deliveredOf('instance:a'));
  t.same(again.get('instance:b'), b, 'a pending written after the failure is in the new log');
});
