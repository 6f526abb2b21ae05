import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { AuditSpool, type AuditSpoolConfig } from '../../src/cli-proxy/audit-spool.js';
import { listAuditSpool, readAuditSpool, readDroppedCount, readSpooledEvent, type AuditEvent } from '../../src/data/audit-event.js';
import { memoryLogger, type LogRecord } from '../support/memory-log.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

function event(i: number): AuditEvent {
  return {
    id: randomUUID(),
    time: new Date(Date.UTC(2026, 0, 1, 0, 0, 0, i)).toISOString(),
    provider: 'saas',
    method: 'GET',
    path: `/v1/items/${i}`,
    status: 200,
    bytesIn: 0,
    bytesOut: 12,
    durationMs: 1.5,
    peerUid: 1000,
  };
}

/** The ids of the events on disk, oldest first. */
async function spooledIds(dir: string): Promise<Array<string | undefined>> {
  const kept = await Promise.all((await listAuditSpool(dir)).map((n) => readSpooledEvent(dir, n)));
  return kept.map((k) => (k && 'event' in k ? k.event.id : undefined));
}

/** A fresh spool in a temp dir, opened, with its log kept in memory. */
async function openSpool(t: TapTest, config: Omit<AuditSpoolConfig, 'dir'>): Promise<{ dir: string; spool: AuditSpool; records: LogRecord[] }> {
  const dir = join(tempDir('ac-spool-', t), 'audit');
  const { log, records } = memoryLogger();
  const spool = new AuditSpool({ dir, ...config }, log);
  await spool.open();
  return { dir, spool, records };
}

/** `n` events recorded at once, as from n answers in one tick, then written. */
async function recordAll(spool: AuditSpool, n: number): Promise<AuditEvent[]> {
  const events = Array.from({ length: n }, (_, i) => event(i));
  for (const e of events) spool.record(e);
  await spool.flush();
  return events;
}

t.test('one 0640 file per event, oldest first; past the bound the oldest go and the persisted counter says how many', async (t) => {
  const dir = join(tempDir('ac-spool-', t), 'audit');
  const { log, records } = memoryLogger();
  const spool = new AuditSpool({ dir, maxEvents: 3 }, log);
  await spool.open();
  const events = Array.from({ length: 5 }, (_, i) => event(i));
  for (const e of events) spool.record(e);
  await spool.flush();
  const names = await listAuditSpool(dir);
  t.equal(names.length, 3, 'held to the bound');
  // What doctor and status read of it, without reading an event: the bound is the one this spool enforces.
  t.same(await readAuditSpool(dir), { events: 3, oldestAt: Date.parse(events[2]?.time ?? ''), dropped: 2, maxEvents: 3, maxEventsRecorded: true }, 'readAuditSpool');
  t.same(
    await spooledIds(dir),
    events.slice(2).map((e) => e.id),
    'the newest three, oldest first',
  );
  for (const n of names) t.equal(statSync(join(dir, n)).mode & 0o777, 0o640);
  t.equal(await readDroppedCount(dir), 2);
  t.ok(records.some((r) => r.msg === 'audit spool full: oldest events dropped'));

  // A restart keeps counting from the persisted count.
  const again = new AuditSpool({ dir, maxEvents: 3 }, log);
  await again.open();
  again.record(event(9));
  await again.flush();
  t.equal(await readDroppedCount(dir), 3, 'the counter only grows, across restarts');
  t.equal((await listAuditSpool(dir)).length, 3);
});

t.test('an event that fails the schema (a query in its path) is not written; the error names no value', async (t) => {
  const dir = join(tempDir('ac-spool-', t), 'audit');
  const { log, records, lines } = memoryLogger();
  const spool = new AuditSpool({ dir, maxEvents: 10 }, log);
  await spool.open();
  spool.record({ ...event(1), path: '/v1/items?key=SECRET-IN-QUERY' });
  await spool.flush();
  t.same(readdirSync(dir), ['spool.json'], 'nothing written but the bound');
  t.ok(records.some((r) => r.msg === 'audit event not spooled'));
  t.notOk(lines.join('\n').includes('SECRET-IN-QUERY'), 'the value is not logged');
});

t.test('open() removes a temp file a killed writer left, never a live one, and reads no temp file as an event', async (t) => {
  const dir = join(tempDir('ac-spool-', t), 'audit');
  const { log } = memoryLogger();
  await new AuditSpool({ dir, maxEvents: 10 }, log).open();
  const e = event(1);
  const dead = `.000000000000001-${e.id}.json.999999999.0123456789ab.tmp`;
  const live = `.000000000000001-${e.id}.json.${process.pid}.0123456789ab.tmp`;
  writeFileSync(join(dir, dead), '{"id":"half');
  writeFileSync(join(dir, live), '{"id":"half');
  t.same(await listAuditSpool(dir), [], 'temp files are not events');
  await new AuditSpool({ dir, maxEvents: 10 }, log).open();
  t.same(readdirSync(dir).sort(), [live, 'spool.json'], 'the dead writer\'s temp is gone');
  t.equal(readFileSync(join(dir, live), 'utf8'), '{"id":"half');
});

t.test('a spool that stays full keeps exactly the newest events and counts every drop', async (t) => {
  const { dir, spool } = await openSpool(t, { maxEvents: 10 });
  const events = await recordAll(spool, 50);
  t.same(
    await spooledIds(dir),
    events.slice(40).map((e) => e.id),
    'the newest ten',
  );
  t.equal(await readDroppedCount(dir), 40);
});

t.test('the full-spool warning is logged once per episode: when it first overflows, again only after it had room', async (t) => {
  const { dir, spool, records } = await openSpool(t, { maxEvents: 5 });
  const full = (): typeof records => records.filter((r) => r.msg === 'audit spool full: oldest events dropped');
  const room = (): typeof records => records.filter((r) => r.msg === 'audit spool has room again');

  for (let i = 0; i < 30; i++) spool.record(event(i));
  await spool.flush();
  t.equal(await readDroppedCount(dir), 25, 'every overflow dropped one event');
  t.equal(full().length, 1, 'one warning for 25 drops');
  t.match(full()[0], { level: 40, dropped: 1, droppedTotal: 1, maxEvents: 5 }, 'logged at the first drop, with the count so far');
  t.equal(room().length, 0, 'still full');

  // The link uploads and deletes everything; the next calls find room.
  for (const n of await listAuditSpool(dir)) rmSync(join(dir, n));
  for (let i = 30; i < 33; i++) spool.record(event(i));
  await spool.flush();
  t.equal(room().length, 1, 'one line when the spool has room again');
  const dropped = await readDroppedCount(dir);
  t.match(room()[0], { level: 30, droppedTotal: dropped, maxEvents: 5 });
  t.equal(room()[0]?.droppedInEpisode, dropped, 'the episode dropped all there is');
  t.equal(full().length, 1, 'no new warning while there is room');

  // Full again: a new episode, a new warning, once.
  for (let i = 33; i < 50; i++) spool.record(event(i));
  await spool.flush();
  t.equal(full().length, 2, 'a second episode, a second warning');
  t.equal(full()[1]?.droppedTotal, dropped + 1, 'it starts from the total so far');
  t.equal((await listAuditSpool(dir)).length, 5, 'held to the bound');
});

t.test('a burst faster than the disk: past maxQueued waiting, new events are shed, counted in dropped.json, logged once', async (t) => {
  const { dir, spool, records } = await openSpool(t, { maxEvents: 100, maxQueued: 4 });
  // All at once: no write can finish in between.
  const burst = await recordAll(spool, 10);
  t.same(
    await spooledIds(dir),
    burst.slice(0, 4).map((e) => e.id),
    'the first four, already queued, are written',
  );
  t.equal(await readDroppedCount(dir), 6, 'the six shed are counted');
  const full = records.filter((r) => r.msg === 'audit queue full: the disk is behind; new events dropped');
  t.equal(full.length, 1, 'one warning for six shed');
  t.match(full[0], { level: 40, maxQueued: 4 });

  spool.record(event(20));
  await spool.flush();
  t.match(records.filter((r) => r.msg === 'audit queue has room again'), [{ level: 30, droppedInEpisode: 6 }], 'the end of the episode, with its count');
  t.equal((await listAuditSpool(dir)).length, 5, 'room again: written');
  t.equal(await readDroppedCount(dir), 6, 'nothing more dropped');
});

t.test('a full spool writes each event within the turn that recorded it, as a spool with room does: nothing waits on the disk', async (t) => {
  // The link away (or a host never enrolled): every call drops the oldest event first. The
  // count is saved and the oldest deleted with synchronous calls and no fsync, like the
  // event itself, so a full spool cannot fall behind the calls (it used to: two fsyncs per
  // drop through libuv's pool, a few hundred events a second, the rest queued in memory).
  const { dir, spool } = await openSpool(t, { maxEvents: 200 });
  const events = await recordAll(spool, 200);
  // The first drop lists the directory (asynchronously, and only once per tenth of the
  // bound: the next 19 drops use that listing), so it is made and awaited here.
  const first = event(250);
  events.push(first);
  spool.record(first);
  await spool.flush();
  for (let i = 0; i < 19; i++) {
    const e = event(300 + i);
    events.push(e);
    spool.record(e);
    // One turn of the event loop: every microtask of the record has run, and at most one
    // poll phase has passed (an fsync through the pool and back needs one each).
    await new Promise((resolve) => setImmediate(resolve));
    t.equal(spool.queued, 0, `drop ${i + 2}: the event is written in its own turn`);
  }
  t.equal(await readDroppedCount(dir), 20, 'every drop counted');
  t.same(
    await spooledIds(dir),
    events.slice(20).map((e) => e.id),
    'the newest 200, oldest first',
  );
});
