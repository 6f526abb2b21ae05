import { chmodSync, mkdirSync, renameSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { emptySlotFile, handoffPaths, SLOT_MANIFEST_FILE, slotFileName, slotManifestText } from '../../src/data/handoff.js';
import { SlotCache } from '../../src/data/slot-cache.js';
import { watchDir } from '../../src/fs/dir-watch.js';
import { tempDir } from '../support/temp-dir.js';

function setup(): { paths: ReturnType<typeof handoffPaths>; write: (slot: string, body?: unknown) => void } {
  const paths = handoffPaths(tempDir('ac-slot-cache-', t));
  mkdirSync(paths.slots, { recursive: true });
  const write = (slot: string, body: unknown = emptySlotFile(slot)): void => {
    const tmp = join(paths.slots, `.${slotFileName(slot)}.tmp`);
    writeFileSync(tmp, typeof body === 'string' ? body : JSON.stringify(body));
    renameSync(tmp, join(paths.slots, slotFileName(slot)));
  };
  return { paths, write };
}

t.test('SlotCache: a full scan first, then only the files it was told changed', async (t) => {
  const { paths, write } = setup();
  write('instance:a');
  write('instance:b');
  const cache = new SlotCache(paths, 60_000);
  const first = await cache.current(1_000);
  t.strictSame(first.slots.map((s) => s.slot), ['instance:a', 'instance:b'], 'the first call scans the directory');

  // Changed on disk but not reported: the cache does not look (that is the point of it).
  write('instance:a', { ...emptySlotFile('instance:a'), tokenId: 'tok_1', expiresAt: '2030-01-01T00:00:00.000Z' });
  write('instance:c');
  t.strictSame((await cache.current(2_000)).slots.map((s) => s.slot), ['instance:a', 'instance:b'], 'unreported changes are not read');

  cache.changed(slotFileName('instance:a'));
  const after = await cache.current(3_000);
  t.equal(after.slots.find((s) => s.slot === 'instance:a')?.tokenId, 'tok_1', 'a reported file is re-read');
  t.notOk(after.slots.some((s) => s.slot === 'instance:c'), 'an unreported new file is still unknown');

  const rescanned = await cache.current(1_000 + 60_000);
  t.ok(rescanned.slots.some((s) => s.slot === 'instance:c'), 'the periodic full rescan finds what no event reported');
});

t.test('SlotCache: a deleted file leaves, an invalid one is an error, an unreadable one keeps its entry', async (t) => {
  const { paths, write } = setup();
  write('instance:a');
  write('instance:b');
  write('cli:notion');
  const cache = new SlotCache(paths, 60_000);
  await cache.current(0);
  rmSync(join(paths.slots, slotFileName('instance:a')));
  write('instance:b', '{not json');
  cache.changed(slotFileName('instance:a'));
  cache.changed(slotFileName('instance:b'));
  const now = await cache.current(1);
  t.strictSame(now.slots.map((s) => s.slot), ['cli:notion'], 'the deleted slot is gone, the invalid one is not a slot');
  t.strictSame(now.errors.map((e) => e.file), [slotFileName('instance:b')], 'the invalid file is reported by name');
  t.strictSame([...cache.present()].sort(), ['cli:notion', 'instance:b'], 'present: files that exist, valid or not');

  if (process.getuid?.() === 0) {
    // Root reads anything; drop to a check that needs no other user: a directory in the way.
    rmSync(join(paths.slots, slotFileName('cli:notion')));
    mkdirSync(join(paths.slots, slotFileName('cli:notion')));
  } else {
    chmodSync(join(paths.slots, slotFileName('cli:notion')), 0o000);
  }
  cache.changed(slotFileName('cli:notion'));
  t.strictSame((await cache.current(2)).slots.map((s) => s.slot), ['cli:notion'], 'a file that cannot be read for now keeps its last entry');
  cache.changed();
  t.strictSame((await cache.current(3)).slots.map((s) => s.slot), [], 'changed() with no name rescans everything');
});

t.test('watchDir reports each renamed-in file by name and ignores dot files', async (t) => {
  const { paths, write } = setup();
  const seen: Array<string | undefined> = [];
  let notify: (() => void) | undefined;
  const stop = watchDir(
    paths.slots,
    (name) => {
      seen.push(name);
      notify?.();
    },
    (err) => t.fail(err.message),
  );
  t.teardown(stop);
  const arrived = (name: string): Promise<void> =>
    new Promise((resolve) => {
      const check = (): void => {
        if (seen.includes(name)) resolve();
      };
      notify = check;
      check();
    });
  write('instance:w');
  await arrived(slotFileName('instance:w'));
  t.ok(seen.includes(slotFileName('instance:w')), 'the slot file is named');
  t.notOk(seen.some((n) => n?.startsWith('.')), 'the writer temp is not reported');
});

t.test('watchDir on a missing directory reports the error and returns a no-op stop', async (t) => {
  const errors: string[] = [];
  const stop = watchDir(join(tempDir('ac-dir-watch-', t), 'missing'), () => t.fail('no change expected'), (err) => errors.push(err.message));
  stop();
  t.equal(errors.length, 1, 'one error');
  t.match(errors[0], /ENOENT/, 'naming the cause');
});

t.test('SlotCache.changes: what changed since the last call, a full rescan saying what is gone', async (t) => {
  const { paths, write } = setup();
  write('instance:a');
  write('instance:b');
  const cache = new SlotCache(paths, 60_000);
  const first = await cache.changes(0);
  t.equal(first.full, true, 'the first call is a full scan');
  t.strictSame(first.updated.map((e) => e.slot), ['instance:a', 'instance:b']);
  t.strictSame(first.removed, []);

  t.strictSame(await cache.changes(1), { full: false, updated: [], removed: [] }, 'nothing reported, nothing changed');

  write('instance:a', { ...emptySlotFile('instance:a'), tokenId: 'tok_1', expiresAt: '2030-01-01T00:00:00.000Z' });
  write('instance:c', '{not json');
  rmSync(join(paths.slots, slotFileName('instance:b')));
  for (const s of ['instance:a', 'instance:b', 'instance:c', 'instance:a']) cache.changed(slotFileName(s));
  const next = await cache.changes(2);
  t.equal(next.full, false);
  t.strictSame(
    next.updated.map((e) => ('error' in e ? `${e.slot}!` : `${e.slot}:${e.tokenId ?? ''}`)),
    ['instance:a:tok_1', 'instance:c!'],
    'each changed slot once, an invalid one as an error',
  );
  t.strictSame(next.removed, ['instance:b'], 'a deleted file is removed');

  // Changes no event reported: the rescan finds them, and says which slots went.
  rmSync(join(paths.slots, slotFileName('instance:a')));
  write('instance:d');
  const full = await cache.changes(60_002);
  t.equal(full.full, true, 'the periodic rescan');
  t.strictSame(full.updated.map((e) => e.slot).sort(), ['instance:c', 'instance:d']);
  t.strictSame(full.removed, ['instance:a']);
});

t.test('SlotCache: at rest a periodic check reads nothing; a rescan reads only the files whose identity changed', async (t) => {
  const { paths, write } = setup();
  for (const s of ['instance:a', 'instance:b', 'instance:c']) write(s);
  const healEveryMs = 600_000;
  const cache = new SlotCache(paths, 60_000, { healEveryMs });
  // The directory as if its last entry changed long ago (a fresh mtime is looked at again, whatever it says).
  const settle = (): void => utimesSync(paths.slots, new Date(Date.now() - 3_600_000), new Date(Date.now() - 3_600_000));
  settle();
  const first = await cache.changes(0);
  t.equal(first.updated.length, 3, 'the first call reads every file');
  t.strictSame(cache.stats, { rescans: 1, rescanReads: 3, manifestReads: 0 });

  // An edit in place moves no entry: the directory looks unchanged and nothing is read.
  writeFileSync(join(paths.slots, slotFileName('instance:b')), JSON.stringify({ ...emptySlotFile('instance:b'), tokenId: 'tok_inplace', expiresAt: '2030-01-01T00:00:00.000Z' }));
  const quiet = await cache.changes(60_000);
  t.strictSame(quiet, { full: false, updated: [], removed: [] }, 'a periodic check of an unchanged directory says nothing changed');
  t.strictSame(cache.stats, { rescans: 1, rescanReads: 3, manifestReads: 0 }, 'and reads nothing');

  // A file renamed in and one removed move the directory's mtime: the next check rescans,
  // reading the new file alone (the others' identity is as read).
  write('instance:d');
  rmSync(join(paths.slots, slotFileName('instance:a')));
  settle(); // its ctime still moves: the directory is not as it was seen
  t.strictSame(await cache.changes(60_001), { full: false, updated: [], removed: [] }, 'not before its time');
  const rescan = await cache.changes(120_000);
  t.equal(rescan.full, true, 'the directory changed: a rescan');
  t.strictSame(rescan.updated.map((e) => e.slot).sort(), ['instance:b', 'instance:c', 'instance:d'], 'a rescan says every slot there is');
  t.strictSame(rescan.removed, ['instance:a'], 'and which went');
  t.strictSame(cache.stats, { rescans: 2, rescanReads: 5, manifestReads: 0 }, 'one more rescan, reading the new file and the one edited in place (its size differs)');
  const b = rescan.updated.find((e) => e.slot === 'instance:b');
  t.equal(b && !('error' in b) ? b.tokenId : undefined, 'tok_inplace', 'the edit in place is read at the rescan');

  // The heal bound: an edit in place whose event was lost is read at the latest after healEveryMs.
  writeFileSync(join(paths.slots, slotFileName('instance:c')), JSON.stringify({ ...emptySlotFile('instance:c'), tokenId: 'tok_healed', expiresAt: '2030-01-01T00:00:00.000Z' }));
  const readsBefore = cache.stats.rescanReads;
  t.strictSame(await cache.changes(180_000), { full: false, updated: [], removed: [] }, 'an unchanged directory is not rescanned');
  const healed = await cache.changes(120_000 + healEveryMs);
  t.equal(healed.full, true, 'the heal rescans whatever the directory says');
  t.equal(cache.stats.rescanReads - readsBefore, 1, 'reading only the file edited in place');
  const c = healed.updated.find((e) => e.slot === 'instance:c');
  t.equal(c && !('error' in c) ? c.tokenId : undefined, 'tok_healed', 'as it is now');

  // A file replaced by a symlink: its identity changed, the read refuses it, the slot goes.
  rmSync(join(paths.slots, slotFileName('instance:d')));
  symlinkSync(join(paths.slots, slotFileName('instance:c')), join(paths.slots, slotFileName('instance:d')));
  const linked = await cache.changes(120_000 + healEveryMs + 60_000);
  t.strictSame(linked.removed, ['instance:d'], 'a symlink is not a slot file');
  t.notOk([...cache.present()].includes('instance:d'));

  // changed() with no name (SIGHUP, a watcher's error) re-reads every file.
  const reads = cache.stats.rescanReads;
  cache.changed();
  await cache.changes(120_000 + healEveryMs + 60_001);
  t.equal(cache.stats.rescanReads - reads, 3, 'every slot file read again');
});

t.test('SlotCache: after a burst of names it rescans within seconds, finding files whose events were lost', async (t) => {
  const { paths, write } = setup();
  const cache = new SlotCache(paths, 60_000);
  await cache.current(1_000);
  // 1 300 files written, 999 of them reported: the kernel's queue dropped the rest.
  for (let i = 0; i < 1_300; i++) write(`instance:s${i}`);
  for (let i = 0; i < 999; i++) cache.changed(slotFileName(`instance:s${i}`));
  t.equal((await cache.current(2_000)).slots.length, 999, 'only the reported files are read');
  t.equal(cache.nextCheckIn(2_000), 59_000, 'below the burst size: the next check is the periodic one');
  const rescans = cache.stats.rescans;
  t.equal((await cache.current(6_000)).slots.length, 999, 'and nothing is rescanned before it');
  t.equal(cache.stats.rescans, rescans);

  cache.changed(slotFileName('instance:s999'));
  t.equal(cache.nextCheckIn(6_000), 0, 'the 1 000th name makes a rescan owed: due now, 5 s after the last one');
  t.equal((await cache.current(6_000)).slots.length, 1_300, 'the rescan finds every file no event reported');
  t.equal(cache.stats.rescans, rescans + 1);
  t.equal(cache.nextCheckIn(6_000), 60_000, 'and the count starts again: the next check is the periodic one, from this rescan');
});

t.test('SlotCache: the manifest is read once per change of it; its ids without a file are empty slots; a file wins; a shared cache serves changes() and current()', async (t) => {
  const { paths, write } = setup();
  const manifestPath = join(paths.slots, SLOT_MANIFEST_FILE);
  const manifest = (slots: string[]): void => {
    writeFileSync(`${manifestPath}.tmp`, slotManifestText(slots));
    renameSync(`${manifestPath}.tmp`, manifestPath);
  };
  const many = Array.from({ length: 10_000 }, (_, i) => `instance:m${String(i).padStart(5, '0')}`);
  manifest(many);
  write('instance:m00000', { ...emptySlotFile('instance:m00000'), tokenId: 'tok_0', expiresAt: '2030-01-01T00:00:00.000Z' });
  const cache = new SlotCache(paths, 60_000);
  const first = await cache.changes(0);
  t.equal(first.updated.length, 10_000, 'every slot, from one manifest and one file');
  t.equal(cache.stats.manifestReads, 1);
  const m0 = first.updated.find((e) => e.slot === 'instance:m00000');
  t.equal(m0 && !('error' in m0) ? m0.tokenId : undefined, 'tok_0', 'the file wins over its manifest entry');

  // A new state: one more id, two fewer (one of them holding a file, which keeps it a slot).
  manifest([...many.slice(2), 'cli:new']);
  cache.changed(SLOT_MANIFEST_FILE);
  cache.changed(SLOT_MANIFEST_FILE);
  const listing = await cache.current(1);
  t.equal(listing.slots.length, 9_999 + 1, 'current(): the union (m00000 kept by its file)');
  t.equal(cache.stats.manifestReads, 2, 'read once for two events');
  const next = await cache.changes(2);
  t.strictSame(next, { full: false, updated: [emptySlotFile('cli:new')], removed: ['instance:m00001'] }, 'changes() after a current(): what changed, not lost to the other reader');
  t.strictSame(await cache.changes(3), { full: false, updated: [], removed: [] });

  // The retirement of a slot with a file: the manifest first (still a slot), then the file (gone).
  t.equal(await cache.exists('instance:m00000'), true, 'its file is there');
  rmSync(join(paths.slots, slotFileName('instance:m00000')));
  cache.changed(slotFileName('instance:m00000'));
  t.strictSame((await cache.changes(4)).removed, ['instance:m00000']);
  t.equal(await cache.exists('instance:m00000'), false);
  manifest(['cli:new']);
  cache.changed(SLOT_MANIFEST_FILE);
  t.equal(await cache.exists('instance:m00005'), false, 'exists() reads a manifest reported changed');
  t.equal(await cache.exists('cli:new'), true);
  t.equal((await cache.changes(5)).removed.length, 9_998, 'and changes() still says what went');

  // A planted, invalid manifest: no ids, an error; the files still read.
  write('instance:f');
  writeFileSync(manifestPath, '{"v":1,"slots":"nope"}');
  cache.changed(SLOT_MANIFEST_FILE);
  cache.changed(slotFileName('instance:f'));
  const bad = await cache.current(6);
  t.same(bad.slots.map((s) => s.slot), ['instance:f']);
  t.same(bad.errors.map((e) => e.file), [SLOT_MANIFEST_FILE]);
  rmSync(manifestPath);
  symlinkSync(join(paths.slots, slotFileName('instance:f')), manifestPath);
  cache.changed(SLOT_MANIFEST_FILE);
  t.match((await cache.current(7)).errors, [{ file: SLOT_MANIFEST_FILE, error: /symlink/ }]);
  // A rescan finds a manifest whose event was lost.
  rmSync(manifestPath);
  manifest(['cli:late']);
  cache.changed();
  t.same((await cache.current(8)).slots.map((s) => s.slot).sort(), ['cli:late', 'instance:f']);
});
