import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { handoffPaths, readSlotFile, readSlots, SLOT_MANIFEST_FILE, slotFileSchema, slotManifestText, type HandoffPaths, type SlotFile } from '../../src/data/handoff.js';
import { ensureSlot, ensureSlots, manifestSlots, removeManifest, retireSlot, slotInForce, writeManifest, writeSlotFile } from '../../src/apply/slot-admin.js';
import { tempDir } from '../support/temp-dir.js';

function handoff(): HandoffPaths {
  return handoffPaths(join(tempDir('ac-slots-', t), 'handoff'));
}

const SLOT = 'instance:inst-1';

function slotPath(p: HandoffPaths, slot = SLOT): string {
  return join(p.slots, `${slot}.json`);
}

t.test('ensureSlot: creates the slot file with tokenId null, 0640, once', async (t) => {
  const p = handoff();
  t.equal(await ensureSlot(p, SLOT), true, 'created');
  t.strictSame(JSON.parse(readFileSync(slotPath(p), 'utf8')) as unknown, { slot: SLOT, tokenId: null, expiresAt: null, generation: 0 });
  t.equal(statSync(slotPath(p)).mode & 0o777, 0o640);
  const ino = statSync(slotPath(p)).ino;
  const text = readFileSync(slotPath(p), 'utf8');
  t.equal(await ensureSlot(p, SLOT), false, 'second call: nothing to do');
  t.equal(await ensureSlot(p, SLOT), false, 'third call: nothing to do');
  t.equal(statSync(slotPath(p)).ino, ino, 'not rewritten');
  t.equal(readFileSync(slotPath(p), 'utf8'), text);
  const { slots, errors } = await readSlots(p);
  t.strictSame(errors, []);
  t.strictSame(slots.map((s) => s.slot), [SLOT], 'fetch sees exactly one slot');
});

t.test('ensureSlot: both slot kinds, side by side', async (t) => {
  const p = handoff();
  t.equal(await ensureSlot(p, SLOT), true);
  t.equal(await ensureSlot(p, 'cli:notion'), true);
  t.ok(existsSync(join(p.slots, 'cli:notion.json')), 'colon kept in the file name');
  t.strictSame((await readSlots(p)).slots.map((s) => s.slot), ['cli:notion', SLOT]);
});

t.test('ensureSlot: does not reset an applied slot', async (t) => {
  const p = handoff();
  const applied: SlotFile = {
    slot: SLOT,
    tokenId: 'tok-7',
    expiresAt: '2030-01-01T13:00:00.000Z',
    generation: 7,
    appliedAt: '2030-01-01T12:00:00.000Z',
  };
  await writeSlotFile(p, applied);
  const text = readFileSync(slotPath(p), 'utf8');
  t.equal(await ensureSlot(p, SLOT), false);
  t.equal(readFileSync(slotPath(p), 'utf8'), text, 'token, generation and appliedAt kept');
});

t.test('ensureSlot: clears revoked (a re-bind after a revocation), keeps the rest valid', async (t) => {
  const p = handoff();
  const revoked: SlotFile = { slot: SLOT, tokenId: 'tok-7', expiresAt: '2030-01-01T13:00:00.000Z', generation: 7, revoked: true };
  await writeSlotFile(p, revoked);
  t.equal(await ensureSlot(p, SLOT), true, 'rewritten');
  const after = await readSlotFile(p, SLOT);
  t.ok(after, 'still a valid slot file');
  t.notOk(after?.revoked, 'no longer revoked');
  const raw = JSON.parse(readFileSync(slotPath(p), 'utf8')) as Record<string, unknown>;
  t.ok(slotFileSchema.safeParse(raw).success);
  t.not(raw.revoked, true);
  t.equal(after?.generation, 7, 'the generation never goes backwards');
  t.equal(statSync(slotPath(p)).mode & 0o777, 0o640);
  t.equal(await ensureSlot(p, SLOT), false, 'then idempotent again');
});

t.test('ensureSlot: an invalid slot file is replaced by a fresh one', async (t) => {
  const p = handoff();
  mkdirSync(p.slots, { recursive: true });
  writeFileSync(slotPath(p), '{"slot": "instance:inst-1", "tok');
  t.equal(await ensureSlot(p, SLOT), true);
  t.strictSame(await readSlotFile(p, SLOT), { slot: SLOT, tokenId: null, expiresAt: null, generation: 0 });
});

t.test('retireSlot: removes the slot file and reports whether there was one', async (t) => {
  const p = handoff();
  t.equal(await retireSlot(p, SLOT), false, 'nothing to retire (no directory)');
  await ensureSlot(p, SLOT);
  await ensureSlot(p, 'cli:notion');
  t.equal(await retireSlot(p, SLOT), true, 'retired');
  t.notOk(existsSync(slotPath(p)), 'file gone');
  t.equal(await retireSlot(p, SLOT), false, 'second time: nothing to retire');
  t.strictSame((await readSlots(p)).slots.map((s) => s.slot), ['cli:notion'], 'the other slot is untouched');
  t.equal(await ensureSlot(p, SLOT), true, 'a retired slot can be bound again');
});

t.test('writeSlotFile: 0640, atomic, creates the directory', async (t) => {
  const p = handoff();
  const s: SlotFile = { slot: 'cli:x', tokenId: 't', expiresAt: '2030-01-01T00:00:00.000Z', generation: 4 };
  await writeSlotFile(p, s);
  t.equal(statSync(join(p.slots, 'cli:x.json')).mode & 0o777, 0o640);
  t.strictSame(await readSlotFile(p, 'cli:x'), s);
});

t.test('ensureSlots: no file for a slot without one (the manifest names it); the unreadable rewritten, the revoked revived; the good left; a symlink refused', async (t) => {
  const p = handoff();
  const slots = Array.from({ length: 300 }, (_, i) => `instance:inst-${String(i).padStart(3, '0')}`);
  t.has(await ensureSlots(p, slots, new Set()), { written: [], read: 0 }, 'a new slot gets no file of its own');
  t.notOk(existsSync(p.slots) && readdirSync(p.slots).length > 0, 'nothing written');
  await writeSlotFile(p, { slot: slots[0]!, tokenId: null, expiresAt: null, generation: 0 });
  const good = slots[1]!;
  const held: SlotFile = { slot: good, tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 };
  await writeSlotFile(p, held);
  const ino = statSync(slotPath(p, good)).ino;
  writeFileSync(slotPath(p, slots[2]!), '');
  await writeSlotFile(p, { ...held, slot: slots[3]!, revoked: true });
  const present = new Set(slots.slice(0, 4));
  t.same((await ensureSlots(p, slots.slice(0, 4), present, { revive: false })).written, [slots[2]], 'without revive: the emptied one only');
  t.same((await ensureSlots(p, slots.slice(0, 4), present)).written, [slots[3]], 'the revoked one revived');
  t.notOk((await readSlotFile(p, slots[3]!))?.revoked, 'no longer revoked');
  t.equal((await readSlotFile(p, slots[3]!))?.tokenId, 'tid_1', 'what it held is kept');
  t.equal(statSync(slotPath(p, good)).ino, ino, 'the good one is not rewritten');
  t.strictSame(await readSlotFile(p, good), held);

  const elsewhere = join(tempDir('ac-slots-target-', t), 'x');
  writeFileSync(elsewhere, 'mine\n');
  symlinkSync(elsewhere, slotPath(p, 'instance:linked'));
  await t.rejects(ensureSlots(p, ['instance:linked'], new Set(['instance:linked'])), /symlink/);
  t.equal(readFileSync(elsewhere, 'utf8'), 'mine\n', 'the file behind it untouched');
});

t.test('writeManifest: whole, 0640, its temp gone; the same ids are no write; a symlink planted at its name is replaced, not followed', async (t) => {
  const p = handoff();
  const slots = Array.from({ length: 40 }, (_, i) => `cli:prov-${String(i).padStart(2, '0')}`);
  t.equal(await writeManifest(p, new Set(slots), 7), true);
  const path = join(p.slots, SLOT_MANIFEST_FILE);
  t.strictSame(JSON.parse(readFileSync(path, 'utf8')) as unknown, { v: 1, version: 7, slots });
  t.equal(statSync(path).mode & 0o777, 0o640);
  t.same(readdirSync(p.slots).filter((n) => n.startsWith('.')), [], 'no temp file left');
  t.same([...(await manifestSlots(p))].sort(), slots);
  const ino = statSync(path).ino;
  t.equal(await writeManifest(p, new Set([...slots].reverse()), 8), false, 'the same ids: not written again');
  t.equal(statSync(path).ino, ino);
  t.same((await readSlots(p)).slots.map((s) => s.slot), slots, 'readers see every slot, empty');

  const elsewhere = join(tempDir('ac-slots-target-', t), 'x');
  writeFileSync(elsewhere, 'mine\n');
  rmSync(path);
  symlinkSync(elsewhere, path);
  t.same([...(await manifestSlots(p))], [], 'a symlinked manifest names no slot');
  await t.rejects(writeManifest(p, new Set(slots.slice(1))), /symlink|not a regular/, 'atomicWrite refuses a symlink at the name');
  t.equal(readFileSync(elsewhere, 'utf8'), 'mine\n', 'the file behind the link untouched');
  rmSync(path);
  t.equal(await writeManifest(p, new Set(slots.slice(1))), true);
  t.same([...(await manifestSlots(p))].sort(), slots.slice(1));
  t.equal(await removeManifest(p), true);
  t.same([...(await manifestSlots(p))], []);
});

t.test('slotInForce: a manifest id without a file is in force, empty; a file wins; neither is not in force', async (t) => {
  const p = handoff();
  await writeManifest(p, new Set(['instance:a', 'instance:b']));
  t.strictSame(await slotInForce(p, 'instance:a'), { slot: 'instance:a', tokenId: null, expiresAt: null, generation: 0 });
  const held: SlotFile = { slot: 'instance:b', tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 };
  await writeSlotFile(p, held);
  t.strictSame(await slotInForce(p, 'instance:b'), held, 'the file wins');
  t.equal(await slotInForce(p, 'instance:c'), undefined);
  // Rewritten by someone else (a new inode): read again, not the remembered ids.
  const path = join(p.slots, SLOT_MANIFEST_FILE);
  writeFileSync(`${path}.x`, slotManifestText(['instance:c']));
  renameSync(`${path}.x`, path);
  t.equal(await slotInForce(p, 'instance:a'), undefined, 'gone from the new manifest');
  t.ok(await slotInForce(p, 'instance:c'));
  writeFileSync(path, '{"v":1,"slots":["instance:c","instance:c"]}');
  t.equal(await slotInForce(p, 'instance:c'), undefined, 'an invalid manifest (a duplicate id) names no slot');
});

t.test('ensureSlots: a new state reads only the slot files this process does not know unchanged', async (t) => {
  const p = handoff();
  const slots = Array.from({ length: 50 }, (_, i) => `instance:inst-${String(i).padStart(3, '0')}`);
  // Slots that hold a token: their files written by apply's inbox (known to this process).
  for (const slot of slots) await writeSlotFile(p, { slot, tokenId: 'tid_0', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 });
  const all = new Set(slots);
  t.same(await ensureSlots(p, slots.slice(1), all), { written: [], read: 0, looked: 49 }, 'the next state (one gone): nothing read, nothing written; the first look of this process at slots/ looks at every file');
  t.same(await ensureSlots(p, slots.slice(1), all), { written: [], read: 0, looked: 0 }, 'nothing touched since: no file looked at');

  // Changed behind this process's back, each a way the link's group or another apply can:
  // a revocation renamed in (a new inode), a file emptied in place.
  const revokedSlot = slots[1]!;
  const revokedPath = slotPath(p, revokedSlot);
  const other = `${revokedPath}.other`;
  writeFileSync(other, `${JSON.stringify({ slot: revokedSlot, tokenId: 'tid_9', expiresAt: '2030-01-01T00:00:00.000Z', generation: 3, revoked: true })}\n`, { mode: 0o640 });
  renameSync(other, revokedPath);
  writeFileSync(slotPath(p, slots[2]!), '');
  const r = await ensureSlots(p, slots.slice(1), all);
  t.same({ written: [...r.written].sort(), read: r.read, looked: r.looked }, { written: [revokedSlot, slots[2]], read: 2, looked: 2 }, 'the two changed ones looked at and read (and written again), no other');
  t.notOk((await readSlotFile(p, revokedSlot))?.revoked, 'the revocation seen and the slot revived');
  t.equal((await readSlotFile(p, revokedSlot))?.generation, 3, 'what it held is kept');

  // A revocation apply itself applied (inbox) is known too: the next state revives it without a listing of every file.
  await writeSlotFile(p, { slot: slots[3]!, tokenId: 'tid_3', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1, revoked: true });
  t.same(await ensureSlots(p, slots.slice(1), all), { written: [slots[3]], read: 1, looked: 3 }, 'only the revoked one read, and revived (the two rewritten before looked at again)');
  t.same(await ensureSlots(p, slots.slice(1), all), { written: [], read: 0, looked: 1 }, 'the one revived looked at again');
  t.same(await ensureSlots(p, slots.slice(1), all), { written: [], read: 0, looked: 0 });

  // An edit in place by root (bind, an operator) and a chmod: touched, looked at.
  writeFileSync(slotPath(p, slots[5]!), `${JSON.stringify({ slot: slots[5], tokenId: 'tid_5', expiresAt: '2030-01-01T00:00:00.000Z', generation: 2, revoked: true })}\n`);
  t.same(await ensureSlots(p, slots.slice(1), all), { written: [slots[5]], read: 1, looked: 1 }, 'edited in place: seen, revived');
  chmodSync(slotPath(p, slots[6]!), 0o600);
  t.has(await ensureSlots(p, slots.slice(1), all), { read: 1 }, 'a chmod changes the ctime: read again');
});

t.test('ensureSlots: slots/ replaced by another directory (root only: the hand-off root is sticky): every file looked at again', async (t) => {
  const p = handoff();
  const slots = Array.from({ length: 5 }, (_, i) => `instance:inst-${i}`);
  for (const slot of slots) await writeSlotFile(p, { slot, tokenId: 'tid_0', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 });
  const all = new Set(slots);
  t.has(await ensureSlots(p, slots, all), { looked: 5 }, 'the first look: all');
  t.has(await ensureSlots(p, slots, all), { looked: 0 });
  // The same names, one revoked, in a new directory moved into place.
  const next = `${p.slots}.next`;
  mkdirSync(next);
  for (const slot of slots) writeFileSync(join(next, slotPath(p, slot).slice(p.slots.length + 1)), `${JSON.stringify({ slot, tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1, revoked: slot === slots[2] })}\n`, { mode: 0o640 });
  rmSync(p.slots, { recursive: true });
  renameSync(next, p.slots);
  t.same(await ensureSlots(p, slots, all), { written: [slots[2]], read: 5, looked: 5 }, 'a new directory: all looked at and read, the revoked one revived');
  t.has(await ensureSlots(p, slots, all), { read: 0, looked: 1 }, 'then only the one rewritten');
});

/** How many events the kernel queues for an inotify instance (node's loop has one) before it drops the rest. */
function inotifyQueueLimit(): number | undefined {
  try {
    const n = Number(readFileSync('/proc/sys/fs/inotify/max_queued_events', 'utf8').trim());
    // Filling a queue of millions (some hosts raise the limit) would take the test minutes.
    return Number.isSafeInteger(n) && n > 0 && n <= 1 << 18 ? n : undefined;
  } catch {
    return undefined;
  }
}
const queueLimit = inotifyQueueLimit();

t.test('ensureSlots: a change whose event an inotify queue overflow lost (node does not report it) is not seen until the full look 60 s after the last', { skip: queueLimit === undefined ? 'no inotify queue limit to fill (unreadable, or above 262 144)' : false }, async (t) => {
  const p = handoff();
  const slots = Array.from({ length: 5 }, (_, i) => `instance:inst-${i}`);
  const held = (slot: string): SlotFile => ({ slot, tokenId: 'tid_0', expiresAt: '2030-01-01T00:00:00.000Z', generation: 1 });
  for (const slot of slots) await writeSlotFile(p, held(slot));
  const all = new Set(slots);
  let clock = 5_000;
  const now = (): number => clock;
  t.has(await ensureSlots(p, slots, all, { now }), { written: [], looked: 5 }, 'the first look: every file');
  t.has(await ensureSlots(p, slots, all, { now }), { written: [], looked: 0 }, 'nothing touched since: none');

  // The queue filled while the loop does not read it (a burst of writes in slots/: here
  // chmods of two temp-file names the watch ignores, in turn because the kernel merges an
  // event equal to the last queued), then a revocation edited in place: its events are
  // dropped for an IN_Q_OVERFLOW, which libuv drops too.
  const burst = ['.burst-a.tmp', '.burst-b.tmp'].map((name) => join(p.slots, name));
  for (const path of burst) writeFileSync(path, '', { mode: 0o600 });
  for (let i = 0; i < queueLimit!; i++) chmodSync(burst[i % 2]!, 0o600);
  const revoked = slots[2]!;
  writeFileSync(slotPath(p, revoked), `${JSON.stringify({ ...held(revoked), revoked: true })}\n`);

  clock += 59_999;
  t.same(await ensureSlots(p, slots, all, { now }), { written: [], read: 0, looked: 0 }, 'under 60 s since the last full look: the change is not seen, the revoked slot not revived');
  t.equal((await readSlotFile(p, revoked))?.revoked, true, 'still revoked on disk');

  clock += 1;
  t.same(await ensureSlots(p, slots, all, { now }), { written: [revoked], read: 1, looked: 5 }, '60 s: every file looked at, the changed one read and revived');
  t.strictSame(await readSlotFile(p, revoked), held(revoked), 'revived on disk, what it held kept');
  t.equal(statSync(slotPath(p, revoked)).mode & 0o777, 0o640, 'rewritten 0640');
  t.has(await ensureSlots(p, slots, all, { now }), { written: [], read: 0, looked: 1 }, 'the clock unchanged: no full look again (the next is 60 s after this one), only the file rewritten looked at');
});
