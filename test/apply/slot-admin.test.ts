import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { handoffPaths, readSlotFile, readSlots, slotFileSchema, type HandoffPaths, type SlotFile } from '../../src/data/handoff.js';
import { ensureSlot, retireSlot, writeSlotFile } from '../../src/apply/slot-admin.js';
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
