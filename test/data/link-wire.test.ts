import t from 'tap';
import {
  enrollOkSchema,
  enrollRequestSchema,
  hostCredentialSchema,
  linkUrl,
  pairingCodeSchema,
  presenceSchema,
  stateAfterSchema,
} from '../../src/data/link-wire.js';

const RID = '2f1c7a52-33e1-4d3b-9a51-3f0e2b7c9d10';

t.test('enrol request: strict, with a visible-ASCII code', async (t) => {
  const ok = { requestId: RID, code: 'ABCD-1234', host: { hostname: 'box', version: '0.1.0' } };
  t.ok(enrollRequestSchema.safeParse(ok).success);
  for (const [name, body] of [
    ['unknown key', { ...ok, extra: 1 }],
    ['not a uuid', { ...ok, requestId: 'r1' }],
    ['code with a space', { ...ok, code: 'ABCD 1234' }],
    ['code too short', { ...ok, code: 'AB' }],
    ['code too long', { ...ok, code: 'A'.repeat(257) }],
    ['host missing', { requestId: RID, code: 'ABCD-1234' }],
  ] as const) {
    t.notOk(enrollRequestSchema.safeParse(body).success, name);
  }
  t.notOk(pairingCodeSchema.safeParse('abc\n').success, 'a newline is not part of a code');
});

t.test('enrol answer: tolerant of extra fields, strict on what lands in files', async (t) => {
  const r = enrollOkSchema.safeParse({ hostId: 'host_1', credential: 'hc_abc', note: 'x' });
  t.ok(r.success);
  if (r.success) t.same(r.data, { hostId: 'host_1', credential: 'hc_abc' }, 'extra fields stripped');
  t.notOk(enrollOkSchema.safeParse({ hostId: 'h 1', credential: 'hc' }).success, 'hostId must be env-file safe');
  t.notOk(enrollOkSchema.safeParse({ hostId: 'h1', credential: 'hc\nX=1' }).success, 'a credential is one line');
  t.notOk(hostCredentialSchema.safeParse('').success);
  t.notOk(hostCredentialSchema.safeParse('x'.repeat(4097)).success);
});

t.test('presence: strict, no free text', async (t) => {
  const ok = {
    hostId: 'host_1',
    version: '0.1.0',
    stateVersion: 4,
    parts: { forwarder: 'ok', 'cli-proxy': 'degraded' },
    slots: [{ slot: 'instance:inst-a', tokenId: 'tid_1', expiresAt: '2030-01-01T00:00:00Z' }],
    problems: ['token_file_mode'],
  };
  t.ok(presenceSchema.safeParse(ok).success);
  t.ok(presenceSchema.safeParse({ ...ok, stateVersion: null, slots: [] }).success, 'before the first applied state');
  t.notOk(presenceSchema.safeParse({ ...ok, parts: { forwarder: 'fine' } }).success, 'health is ok|degraded|down');
  t.notOk(presenceSchema.safeParse({ ...ok, problems: ['token file /x is 0644'] }).success, 'problems are codes');
  t.notOk(presenceSchema.safeParse({ ...ok, slots: [{ ...ok.slots[0], token: 'gw_secret' }] }).success, 'a slot carries no token');
});

t.test('?after= and URLs under a base path', async (t) => {
  t.equal(stateAfterSchema.parse('12'), 12);
  t.notOk(stateAfterSchema.safeParse('-1').success);
  t.notOk(stateAfterSchema.safeParse('1.5').success);
  t.equal(linkUrl('https://gw.example.com/base/', '/v1/host/state', { after: '3' }).href, 'https://gw.example.com/base/v1/host/state?after=3');
  t.equal(linkUrl('http://127.0.0.1:9', '/v1/host/enroll').href, 'http://127.0.0.1:9/v1/host/enroll');
});
