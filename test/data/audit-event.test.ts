import { randomUUID } from 'node:crypto';
import t from 'tap';
import { auditEventSchema, auditUploadSchema } from '../../src/data/audit-event.js';

const ok = {
  id: randomUUID(),
  time: '2026-01-01T00:00:00.000Z',
  provider: 'saas',
  method: 'GET',
  path: '/v1/items/7',
  status: 200,
  bytesIn: 0,
  bytesOut: 10,
  durationMs: 3.25,
  peerUid: null,
};

t.test('an event is the shape of a call: no query, fragment, extra field or value slips in', async (t) => {
  t.ok(auditEventSchema.safeParse(ok).success);
  for (const [what, bad] of Object.entries({
    query: { ...ok, path: '/v1/items?token=x' },
    fragment: { ...ok, path: '/v1/items#x' },
    relative: { ...ok, path: 'v1/items' },
    long: { ...ok, path: `/${'a'.repeat(200)}` },
    header: { ...ok, authorization: 'Bearer x' },
    method: { ...ok, method: 'get' },
    status: { ...ok, status: 0 },
    provider: { ...ok, provider: '../x' },
    id: { ...ok, id: 'not-a-uuid' },
  })) {
    t.notOk(auditEventSchema.safeParse(bad).success, `refused: ${what}`);
  }
});

t.test('an upload carries 1..500 events and the dropped count', async (t) => {
  t.ok(auditUploadSchema.safeParse({ events: [ok], dropped: 0 }).success);
  t.notOk(auditUploadSchema.safeParse({ events: [], dropped: 0 }).success, 'no empty batch');
  t.notOk(auditUploadSchema.safeParse({ events: [ok] }).success, 'dropped is required');
  t.notOk(auditUploadSchema.safeParse({ events: Array.from({ length: 501 }, () => ok), dropped: 0 }).success, 'at most 500');
});
