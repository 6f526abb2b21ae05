import { randomUUID } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { JOURNAL_BATCHES_IN_FLIGHT, PendingJournal, type JournalEntry } from '../../../src/link/renewal/pending-journal.js';
import { RenewalState, renewalSlotStateSchema } from '../../../src/link/renewal/renewal-state.js';
import { tempDir } from '../../support/temp-dir.js';

const batches = (dir: string): string[] => readdirSync(dir).filter((n) => n.endsWith('.journal')).sort();
const entriesOnDisk = (dir: string): JournalEntry[] =>
  batches(dir).flatMap((n) =>
    readFileSync(join(dir, n), 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as JournalEntry),
  );
const entry = (slot: string, since = '2030-01-01T12:00:00.000Z'): JournalEntry => ({ slot, requestId: randomUUID(), expectedTokenId: null, since });

t.test('renewals started together share one fsynced batch, and each commit returns only once its entry is on disk', async (t) => {
  const dir = tempDir('ac-journal-', t);
  const journal = new PendingJournal(dir);
  const all = Array.from({ length: 40 }, (_, i) => entry(`instance:s-${i}`));
  const onDiskAtResolve: boolean[] = [];
  await Promise.all(
    all.map(async (e) => {
      await journal.commit(e);
      onDiskAtResolve.push(entriesOnDisk(dir).some((d) => d.requestId === e.requestId));
    }),
  );
  t.same(onDiskAtResolve, all.map(() => true), 'every entry was on disk when its commit resolved');
  t.ok(
    batches(dir).length <= JOURNAL_BATCHES_IN_FLIGHT + 1,
    `40 renewals in ${batches(dir).length} batch file(s): the first ones alone while places were free, the rest joined the next`,
  );
  t.same(
    entriesOnDisk(dir).map((e) => e.requestId).sort(),
    all.map((e) => e.requestId).sort(),
    'each requestId once',
  );
  for (const n of batches(dir)) t.equal(statSync(join(dir, n)).mode & 0o777, 0o600, `${n} is 0600`);
  t.same(readdirSync(dir).filter((n) => n.startsWith('.')), [], 'no temp file left');
});

t.test('a batch stays while one of its renewals is pending and goes once every one settled', async (t) => {
  const dir = tempDir('ac-journal-', t);
  const journal = new PendingJournal(dir);
  const [a, b] = [entry('instance:a'), entry('instance:b')];
  await Promise.all([journal.commit(a), journal.commit(b)]);
  t.same(entriesOnDisk(dir).map((e) => e.slot).sort(), ['instance:a', 'instance:b']);
  journal.settle('instance:a');
  t.same(entriesOnDisk(dir).map((e) => e.slot), ['instance:b'], "a's batch gone, b still pending: its batch kept");
  // A new renewal of b supersedes its entry: the old batch is settled, the new one holds b.
  const b2 = entry('instance:b');
  await journal.commit(b2);
  t.same(entriesOnDisk(dir).map((e) => e.requestId), [b2.requestId], "only b's new renewal is left on disk");
  journal.settle('instance:b');
  t.same(batches(dir), [], 'nothing pending: nothing left');
});

t.test('recover: later batches win, a batch is kept only for an entry still pending, new batches do not reuse a name', async (t) => {
  const dir = tempDir('ac-journal-', t);
  const [a1, a2, b, c] = [entry('instance:a'), entry('instance:a'), entry('instance:b'), entry('instance:c')];
  writeFileSync(join(dir, 'pending-3.journal'), `${JSON.stringify(a1)}\n${JSON.stringify(b)}\n`);
  writeFileSync(join(dir, 'pending-7.journal'), `${JSON.stringify(a2)}\nnot json\n{"slot":"instance:x"}\n`);
  writeFileSync(join(dir, 'pending-9.journal'), `${JSON.stringify(c)}\n`);
  writeFileSync(join(dir, 'instance:a.json'), '{}');
  const journal = new PendingJournal(dir);
  const seen = journal.recover((e) => e.slot !== 'instance:c');
  t.same(
    seen.map((e) => e.requestId).sort(),
    [a2, b, c].map((e) => e.requestId).sort(),
    "the newest entry of each slot; invalid lines skipped, never fatal",
  );
  t.same(batches(dir), ['pending-3.journal', 'pending-7.journal'], "c's batch deleted (not kept); a's newest and b's kept");
  journal.settle('instance:b');
  t.same(batches(dir), ['pending-7.journal'], "b settled: its batch goes (a1 in it was superseded)");
  const d = entry('instance:d');
  await journal.commit(d);
  t.same(batches(dir), ['pending-10.journal', 'pending-7.journal'], 'the next batch is numbered after the last one found');
  t.equal(readFileSync(join(dir, 'instance:a.json'), 'utf8'), '{}', 'a slot record is not a batch');
});

t.test('a failed batch write rejects every commit in it: none of those requestIds may be sent', async (t) => {
  const dir = tempDir('ac-journal-', t);
  const journal = new PendingJournal(join(dir, 'gone'));
  await t.rejects(journal.commit(entry('instance:a')), { code: 'ENOENT' });
  const state = new RenewalState(join(dir, 'gone'));
  await t.rejects(state.write({ slot: 'instance:a', pending: { requestId: randomUUID(), expectedTokenId: null, since: '2030-01-01T12:00:00.000Z' } }));
  t.same(await state.read('instance:a'), { slot: 'instance:a' }, 'the refused pending is not kept in memory either');
});

t.test('a pending whose batch could not be written is taken back from the record too: a later attempt cannot send it unjournaled', async (t) => {
  const dir = tempDir('ac-journal-', t);
  const state = new RenewalState(dir);
  const before = { slot: 'instance:a', delivered: { tokenId: 'tok_1', expiresAt: '2030-01-01T18:00:00.000Z', generation: 1, receivedAt: '2030-01-01T12:00:00.000Z' } };
  await state.write(before);
  // The next batch's name taken by a directory: atomicWrite refuses to replace it.
  mkdirSync(join(dir, 'pending-1.journal'));
  const pending = { requestId: randomUUID(), expectedTokenId: 'tok_1', since: '2030-01-01T16:00:00.000Z' };
  await t.rejects(state.write({ ...before, pending }), /non-regular/);
  t.same(await state.read('instance:a'), before, 'in memory: the record as it was');
  t.same(renewalSlotStateSchema.parse(JSON.parse(readFileSync(join(dir, 'instance:a.json'), 'utf8'))), before, 'on disk too: a restart cannot send it either');
});

t.test("RenewalState: a pending requestId its record lost is restored from the journal at start; a settled or forgotten one is not", async (t) => {
  const dir = tempDir('ac-journal-', t);
  const since = '2030-01-01T12:00:00.000Z';
  const later = '2030-01-01T12:00:05.000Z';
  const before = new RenewalState(dir);
  const pending = (slot: string) => ({ slot, pending: { requestId: randomUUID(), expectedTokenId: null, since } });
  const [lost, kept, ...others] = ['instance:lost', 'instance:kept', 'instance:settled', 'instance:adopted', 'instance:forgotten'].map(pending);
  for (const s of [lost, kept, ...others]) if (s) await before.write(s);
  // What a power cut within the writeback delay can leave: the record as it was before
  // (here: no record content beyond the slot), while the fsynced journal holds the requestId.
  writeFileSync(join(dir, 'instance:lost.json'), `${JSON.stringify({ slot: 'instance:lost' })}\n`);
  // Settled after the entry (as the process wrote it before it was killed): not restored.
  writeFileSync(join(dir, 'instance:settled.json'), `${JSON.stringify({ slot: 'instance:settled', delivered: { tokenId: 'tok_1', expiresAt: later, generation: 1, receivedAt: later } })}\n`);
  writeFileSync(join(dir, 'instance:adopted.json'), `${JSON.stringify({ slot: 'instance:adopted', adopted: 'tok_9' })}\n`);
  rmSync(join(dir, 'instance:forgotten.json'));

  const after = new RenewalState(dir);
  t.same(after.recover(), ['instance:lost'], 'only the lost one is restored');
  const onDisk = (slot: string) => renewalSlotStateSchema.parse(JSON.parse(readFileSync(join(dir, `${slot}.json`), 'utf8')));
  t.same(onDisk('instance:lost').pending, lost?.pending, 'the same requestId, expectation and start: its retry is answered with the token already minted');
  t.same((await after.read('instance:lost')).pending, lost?.pending);
  t.same(onDisk('instance:kept').pending, kept?.pending, 'a record that kept its pending is left as it is');
  t.equal(onDisk('instance:settled').pending, undefined, 'delivered since: not restored');
  t.equal(onDisk('instance:adopted').pending, undefined, 'a 409 adopted since: not restored');
  t.notOk(readdirSync(dir).includes('instance:forgotten.json'), 'a forgotten slot gets no record back');
  // Settling the two still pending leaves no batch behind.
  await after.write({ slot: 'instance:lost' });
  await after.forget('instance:kept');
  t.same(batches(dir), [], 'every batch gone once nothing in it is pending');
});
