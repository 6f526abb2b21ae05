import { randomUUID } from 'node:crypto';
import t from 'tap';
import { Agent, request, type Dispatcher } from 'undici';
import { DEFAULT_TEST_CREDENTIAL, MockRenewGateway } from '../support/mock-renew-gateway.js';
import type { TapTest } from '../support/tap.js';
import { renewConflictSchema, renewErrorSchema, renewOkSchema, renewPath, type RenewOk } from '../../src/data/renew-wire.js';

const SLOT = 'instance:inst-1';
const OTHER = 'cli:notion';

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  json: unknown;
  ms: number;
}

interface CallOptions {
  requestId?: string;
  expectedTokenId?: string | null;
  credential?: string | null;
  signal?: AbortSignal;
  dispatcher?: Dispatcher;
  path?: string;
  method?: 'POST' | 'GET' | 'PUT';
  contentType?: string | null;
  rawBody?: string;
}

const agent = new Agent({ keepAliveTimeout: 2_000 });
t.teardown(() => agent.close());

async function start(t: TapTest): Promise<MockRenewGateway> {
  const gw = await MockRenewGateway.start({ slots: [SLOT, OTHER] });
  t.teardown(() => gw.close());
  return gw;
}

async function call(gw: MockRenewGateway, slot: string, o: CallOptions = {}): Promise<Answer> {
  const headers: Record<string, string> = {};
  const credential = o.credential === undefined ? DEFAULT_TEST_CREDENTIAL : o.credential;
  if (credential !== null) headers.authorization = `Bearer ${credential}`;
  const contentType = o.contentType === undefined ? 'application/json' : o.contentType;
  if (contentType !== null) headers['content-type'] = contentType;
  const body = o.rawBody ?? JSON.stringify({ requestId: o.requestId ?? randomUUID(), expectedTokenId: o.expectedTokenId ?? null });
  const started = Date.now();
  const res = await request(`${gw.url}${o.path ?? renewPath(slot)}`, {
    method: o.method ?? 'POST',
    headers,
    body: o.method === 'GET' ? null : body,
    dispatcher: o.dispatcher ?? agent,
    signal: o.signal,
  });
  const text = await res.body.text();
  let json: unknown;
  try {
    json = JSON.parse(text) as unknown;
  } catch {
    json = text;
  }
  return { status: res.statusCode, headers: res.headers, json, ms: Date.now() - started };
}

function ok(a: Answer): RenewOk {
  if (a.status !== 200) throw new Error(`expected 200, got ${a.status} ${JSON.stringify(a.json)}`);
  return renewOkSchema.parse(a.json);
}

/** The undici error code of a rejected request (UND_ERR_SOCKET, ECONNRESET, …). */
async function failure(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    const e = err as { code?: unknown; name?: string; cause?: { code?: unknown } };
    // An aborted request rejects with a DOMException (AbortError/TimeoutError; numeric code).
    if (typeof e.code === 'string') return e.code;
    if (typeof e.cause?.code === 'string') return e.cause.code;
    return e.name ?? 'unknown';
  }
  throw new Error('expected the request to fail');
}

t.test('a normal renewal over HTTP; ":" and "%3A" both route to the slot', async (t) => {
  const gw = await start(t);
  t.equal(renewPath(SLOT), '/v1/host/credentials/instance%3Ainst-1/renew');
  const first = ok(await call(gw, SLOT));
  t.equal(first.slot, SLOT);
  t.equal(first.credentialGeneration, 1);
  const raw = ok(await call(gw, SLOT, { path: `/v1/host/credentials/${SLOT}/renew`, expectedTokenId: first.tokenId }));
  t.equal(raw.credentialGeneration, 2);
  const lower = ok(await call(gw, SLOT, { path: '/v1/host/credentials/instance%3ainst-1/renew?x=1', expectedTokenId: raw.tokenId }));
  t.equal(lower.credentialGeneration, 3);
  t.ok(gw.authority.isValidToken(lower.token));
  t.equal(gw.minted(SLOT), 3);
  t.equal(gw.minted(OTHER), 0);
  t.equal(gw.minted(), 3);
  const rec = gw.requests[0];
  t.match(rec, { seq: 1, method: 'POST', slot: SLOT, expectedTokenId: null, authorization: true, fault: undefined, committed: true, outcome: 200 });
});

t.test('dropAfterCommit: the client sees a socket error; the retry gets the committed token; minted 1', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'dropAfterCommit' });
  const requestId = randomUUID();
  const code = await failure(call(gw, SLOT, { requestId }));
  t.match(code, /UND_ERR_SOCKET|ECONNRESET/);
  t.equal(gw.minted(SLOT), 1, 'committed before the drop');
  const committedTokenId = gw.authority.slotState(SLOT)?.tokenId;
  const retry = ok(await call(gw, SLOT, { requestId, expectedTokenId: null }));
  t.equal(retry.tokenId, committedTokenId, 'the retry returns what was committed');
  t.equal(gw.minted(SLOT), 1, 'no second token');
  t.equal(gw.authority.mintedForRequest(requestId), 1);
  t.equal(gw.authority.stats().replays, 1);
  t.same(
    gw.requests.map((r) => [r.fault, r.committed, r.outcome]),
    [
      ['dropAfterCommit', true, 'dropped'],
      [undefined, true, 200],
    ],
  );
  t.same(gw.faultsFired, { dropAfterCommit: 1 });
});

t.test('resetBeforeCommit: connection reset, nothing minted; the retry mints once', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'resetBeforeCommit' });
  const requestId = randomUUID();
  const code = await failure(call(gw, SLOT, { requestId }));
  t.match(code, /UND_ERR_SOCKET|ECONNRESET/);
  t.equal(gw.minted(), 0);
  ok(await call(gw, SLOT, { requestId }));
  t.equal(gw.minted(), 1);
  t.equal(gw.requests[0]?.outcome, 'reset');
});

t.test('status409 answers the real currentTokenId without touching state', async (t) => {
  const gw = await start(t);
  const first = ok(await call(gw, SLOT));
  gw.inject({ kind: 'status409' });
  const requestId = randomUUID();
  const c = await call(gw, SLOT, { requestId, expectedTokenId: first.tokenId });
  t.equal(c.status, 409);
  t.same(renewConflictSchema.parse(c.json), { error: 'token_conflict', currentTokenId: first.tokenId });
  t.equal(gw.authority.slotState(SLOT)?.tokenId, first.tokenId);
  t.equal(gw.minted(), 1);
  t.equal(ok(await call(gw, SLOT, { requestId, expectedTokenId: first.tokenId })).credentialGeneration, 2);
});

t.test('advanceElsewhere: a genuine conflict, recovered by adopting currentTokenId', async (t) => {
  const gw = await start(t);
  const mine = ok(await call(gw, SLOT));
  const other = gw.advanceElsewhere(SLOT);
  const c = await call(gw, SLOT, { expectedTokenId: mine.tokenId });
  t.equal(c.status, 409);
  const conflict = renewConflictSchema.parse(c.json);
  t.equal(conflict.currentTokenId, other.tokenId);
  const adopted = ok(await call(gw, SLOT, { expectedTokenId: conflict.currentTokenId }));
  t.equal(adopted.credentialGeneration, 3);
  t.equal(gw.minted(SLOT), 2, 'out-of-band mints are not counted as renewals');
  t.equal(gw.authority.stats().mintedElsewhere, 1);
});

t.test('status429 carries Retry-After (seconds or a date); state untouched', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'status429', retryAfterS: 7 });
  gw.inject({ kind: 'status429', retryAfterS: 'Wed, 21 Oct 2037 07:28:00 GMT' });
  gw.inject({ kind: 'status429' });
  const a = await call(gw, SLOT);
  t.equal(a.status, 429);
  t.equal(a.headers['retry-after'], '7');
  t.same(renewErrorSchema.parse(a.json), { error: 'rate_limited' });
  t.equal((await call(gw, SLOT)).headers['retry-after'], 'Wed, 21 Oct 2037 07:28:00 GMT');
  t.equal((await call(gw, SLOT)).headers['retry-after'], '1', 'default 1 s');
  t.equal(gw.minted(), 0);
  t.equal(gw.pendingFaults(), 0);
  ok(await call(gw, SLOT));
});

t.test('status5xx: the given status (default 503); no commit', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'status5xx', status: 502 });
  gw.inject({ kind: 'status5xx' });
  const requestId = randomUUID();
  t.equal((await call(gw, SLOT, { requestId })).status, 502);
  t.equal((await call(gw, SLOT, { requestId })).status, 503);
  t.equal(gw.minted(), 0);
  ok(await call(gw, SLOT, { requestId }));
  t.equal(gw.authority.mintedForRequest(requestId), 1);
});

t.test('status401 and status404 one-shot faults, then normal service', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'status401' });
  gw.inject({ kind: 'status404' });
  const a = await call(gw, SLOT);
  t.equal(a.status, 401);
  t.same(a.json, { error: 'host_credential_invalid' });
  const b = await call(gw, SLOT);
  t.equal(b.status, 404);
  t.same(b.json, { error: 'slot_not_found' });
  ok(await call(gw, SLOT));
});

t.test('slow: commits at once, answers after ms; a client that gives up loses only the answer', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'slow', ms: 300 });
  const a = await call(gw, SLOT);
  t.ok(a.ms >= 280, `answered after ${a.ms} ms`);
  const first = ok(a);

  gw.inject({ kind: 'slow', ms: 2_000 });
  const requestId = randomUUID();
  const code = await failure(call(gw, SLOT, { requestId, expectedTokenId: first.tokenId, signal: AbortSignal.timeout(200) }));
  t.match(code, /Abort|Timeout/);
  t.equal(gw.minted(), 2, 'the commit happened');
  const retry = ok(await call(gw, SLOT, { requestId, expectedTokenId: first.tokenId }));
  t.equal(retry.tokenId, gw.authority.slotState(SLOT)?.tokenId);
  t.equal(gw.minted(), 2);
});

t.test('hang: never answers; the client abort works; commit only when asked', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'hang' });
  const started = Date.now();
  const code = await failure(call(gw, SLOT, { signal: AbortSignal.timeout(200) }));
  t.match(code, /Abort|Timeout/);
  t.ok(Date.now() - started < 2_000, 'abort returned promptly');
  t.equal(gw.minted(), 0);

  gw.inject({ kind: 'hang', commit: true });
  const requestId = randomUUID();
  await failure(call(gw, SLOT, { requestId, signal: AbortSignal.timeout(200) }));
  t.equal(gw.minted(), 1);
  ok(await call(gw, SLOT, { requestId }));
  t.equal(gw.minted(), 1);
  t.same(
    gw.requests.map((r) => r.outcome),
    ['hang', 'hang', 200],
  );
});

t.test('faults are FIFO, one-shot, optionally scoped to a slot', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'status5xx', status: 500 }, { slot: OTHER });
  gw.inject({ kind: 'status429', retryAfterS: 2 }, { times: 2 });
  t.equal(gw.pendingFaults(), 3);
  t.equal(gw.pendingFaults(SLOT), 2);
  t.equal((await call(gw, SLOT)).status, 429, 'the OTHER-scoped fault is skipped for SLOT');
  t.equal((await call(gw, OTHER)).status, 500, 'first matching fault in order');
  t.equal((await call(gw, OTHER)).status, 429);
  t.equal((await call(gw, SLOT)).status, 200);
  t.equal((await call(gw, OTHER)).status, 200);
  t.same(gw.faultsFired, { status429: 2, status5xx: 1 });
  t.equal(gw.totalFaultsFired(), 3);
  gw.inject({ kind: 'hang' });
  gw.clearFaults();
  t.equal(gw.pendingFaults(), 0);
});

t.test('setCredential: every renewal is 401 until the credential is right again', async (t) => {
  const gw = await start(t);
  gw.setCredential('rotated-credential');
  for (let i = 0; i < 3; i++) {
    const a = await call(gw, SLOT);
    t.equal(a.status, 401);
    t.same(a.json, { error: 'host_credential_invalid' });
  }
  t.equal((await call(gw, SLOT, { credential: null })).status, 401, 'no Authorization header');
  ok(await call(gw, SLOT, { credential: 'rotated-credential' }));
  t.same(
    gw.requests.map((r) => r.authorization),
    [true, true, true, false, true],
  );
  t.equal(gw.authority.stats().unauthorized, 4);
});

t.test('revokeSlot → 404 slot_not_found; unknown slot → 404', async (t) => {
  const gw = await start(t);
  ok(await call(gw, SLOT));
  gw.revokeSlot(SLOT);
  t.same((await call(gw, SLOT)).json, { error: 'slot_not_found' });
  t.equal((await call(gw, 'instance:unknown')).status, 404);
});

t.test('HTTP-level rejections: 400, 405, 413, other paths', async (t) => {
  const gw = await start(t);
  const bad = async (o: CallOptions, status: number, error: string): Promise<void> => {
    const a = await call(gw, SLOT, o);
    t.equal(a.status, status, JSON.stringify(o).slice(0, 80));
    t.same(a.json, { error });
  };
  await bad({ rawBody: '{not json' }, 400, 'bad_request');
  await bad({ rawBody: JSON.stringify({ requestId: 'not-a-uuid', expectedTokenId: null }) }, 400, 'bad_request');
  await bad({ rawBody: JSON.stringify({ requestId: randomUUID() }) }, 400, 'bad_request');
  await bad({ rawBody: JSON.stringify({ requestId: randomUUID(), expectedTokenId: null, extra: 1 }) }, 400, 'bad_request');
  await bad({ contentType: null }, 400, 'bad_request');
  await bad({ contentType: 'text/plain' }, 400, 'bad_request');
  ok(await call(gw, SLOT, { contentType: 'application/json; charset=utf-8' }));
  await bad({ path: '/v1/host/credentials/instance%3Aa%2Fb/renew' }, 400, 'bad_request');
  await bad({ path: '/v1/host/credentials/other%3Aabc/renew' }, 400, 'bad_request');
  await bad({ path: '/v1/host/credentials/instance%3A%E0/renew' }, 400, 'bad_request');
  await bad({ rawBody: JSON.stringify({ requestId: randomUUID(), expectedTokenId: null, pad: 'x'.repeat(70_000) }) }, 413, 'payload_too_large');
  const get = await call(gw, SLOT, { method: 'GET' });
  t.equal(get.status, 405);
  t.equal(get.headers.allow, 'POST');
  await bad({ path: '/v1/host/credentials/instance%3Ainst-1/renew/' }, 404, 'not_found');
  await bad({ path: '/v1/other' }, 404, 'not_found');
  t.equal(gw.minted(), 1, 'only the charset variant minted');
  t.equal(gw.totalFaultsFired(), 0);
});

t.test('records never hold the credential or a token', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'dropAfterCommit' });
  const requestId = randomUUID();
  await failure(call(gw, SLOT, { requestId }));
  const tok = ok(await call(gw, SLOT, { requestId }));
  const dump = JSON.stringify({ requests: gw.requests, stats: gw.authority, faults: gw.faultsFired });
  t.notOk(dump.includes(DEFAULT_TEST_CREDENTIAL));
  t.notOk(dump.includes(tok.token));
  t.ok(dump.includes(requestId), 'the requestId (not a secret) is recorded');
});

t.test('waitForRequests resolves on arrival', async (t) => {
  const gw = await start(t);
  const waiting = gw.waitForRequests(2);
  await call(gw, SLOT);
  await call(gw, OTHER);
  const second = await waiting;
  t.equal(second.slot, OTHER);
});
