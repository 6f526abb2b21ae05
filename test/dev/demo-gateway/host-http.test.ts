import t from 'tap';
import { request } from 'undici';
import { parseDesiredState } from '../../../src/data/desired-state.js';
import { enrollOkSchema } from '../../../src/data/link-wire.js';
import { craftedStates, MockHostGateway } from '../../support/mock-host-gateway.js';
import { until } from '../../support/poll.js';
import type { TapTest } from '../../support/tap.js';

/*
 * The host link endpoints over real HTTP (the glue shared by the dev demo Gateway and the
 * mock), and the mock's faults as a client sees them.
 */

const CRED = 'static-test-credential';
const RID = '33333333-3333-4333-8333-333333333333';
const auth = { authorization: `Bearer ${CRED}` };

async function start(t: TapTest, longPollMs?: number): Promise<MockHostGateway> {
  const gw = await MockHostGateway.start({ staticHosts: { 'host-static': CRED }, ...(longPollMs ? { longPollMs } : {}) });
  t.teardown(() => gw.close());
  return gw;
}

async function post(gw: MockHostGateway, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await request(`${gw.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

async function getState(gw: MockHostGateway, query: string, headers: Record<string, string> = auth) {
  const res = await request(`${gw.url}/v1/host/state${query}`, { headers });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

t.test('enrol over HTTP, then the credential reads the state and renews', async (t) => {
  const gw = await start(t);
  const code = gw.control.issuePairingCode();
  const body = { requestId: RID, code, host: { hostname: 'box', version: '0.1.0' } };
  const first = await post(gw, '/v1/host/enroll', body);
  t.equal(first.status, 200);
  t.equal(first.headers['cache-control'], 'no-store');
  const ok = enrollOkSchema.parse(JSON.parse(first.text));
  t.equal((await post(gw, '/v1/host/enroll', body)).text, first.text, 'a repeat answers the same credential');
  const stolen = await post(gw, '/v1/host/enroll', { ...body, requestId: '44444444-4444-4444-8444-444444444444' });
  t.same([stolen.status, JSON.parse(stolen.text)], [401, { error: 'code_invalid' }]);

  const state = await getState(gw, '', { authorization: `Bearer ${ok.credential}` });
  t.equal(state.status, 200, 'no ?after= means 0: the current state at once');
  t.ok(parseDesiredState(state.text).ok);

  gw.control.connectBinding('bind_http_test_1', { instanceId: 'inst-h', upstreamUrl: 'https://gw.example.com/mcp' });
  const renew = await post(gw, '/v1/host/credentials/instance%3Ainst-h/renew', { requestId: RID, expectedTokenId: null }, { authorization: `Bearer ${ok.credential}` });
  t.equal(renew.status, 200, 'the enrolled credential renews the new slot');
  t.notOk(gw.requests.some((r) => JSON.stringify(r).includes(code) || JSON.stringify(r).includes(ok.credential)), 'records hold no secret');
});

t.test('bad requests: 400, 405, 401', async (t) => {
  const gw = await start(t);
  t.equal((await post(gw, '/v1/host/enroll', '{nope')).status, 400);
  t.equal((await post(gw, '/v1/host/enroll', { requestId: RID, code: 'x y', host: { hostname: 'h', version: '1' } })).status, 400);
  const wrongMethod = await getState(gw, '', {});
  t.equal(wrongMethod.status, 401, 'state without a credential');
  const get = await request(`${gw.url}/v1/host/enroll`);
  t.equal(get.statusCode, 405);
  t.equal(get.headers.allow, 'POST');
  await get.body.dump();
  t.equal((await getState(gw, '?after=-1')).status, 400);
  t.equal((await getState(gw, '?after=abc')).status, 400);
  const presence = { hostId: 'host-static', version: '0.1.0', stateVersion: null, parts: {}, slots: [], problems: [] };
  t.equal((await post(gw, '/v1/host/presence', presence, auth)).status, 204);
  t.equal((await post(gw, '/v1/host/presence', presence, { authorization: 'Bearer wrong' })).status, 401);
  t.equal((await post(gw, '/v1/host/presence', { ...presence, extra: 1 }, auth)).status, 400);
  t.equal(gw.control.presences.length, 1);
});

t.test('long poll: answered at once when the state changes, 204 when the hold ends', async (t) => {
  const gw = await start(t, 200);
  const held = getState(gw, '?after=1');
  await until(() => gw.control.waitingPolls === 1, 'the poll is held');
  gw.control.connectProvider('notion', { upstream: 'https://api.notion.com', inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [] });
  const changed = await held;
  t.equal(changed.status, 200);
  const parsed = parseDesiredState(changed.text);
  t.ok(parsed.ok && parsed.value.version === 2 && parsed.value.providers.notion !== undefined);
  const idle = await getState(gw, '?after=2');
  t.equal(idle.status, 204);
  t.equal(idle.text, '');
});

t.test('a client that drops its long poll leaves nothing waiting', async (t) => {
  const gw = await start(t);
  const ac = new AbortController();
  const held = request(`${gw.url}/v1/host/state?after=1`, { headers: auth, signal: ac.signal }).catch((e: unknown) => e);
  await until(() => gw.control.waitingPolls === 1, 'the poll is held');
  ac.abort();
  await held;
  await until(() => gw.control.waitingPolls === 0, 'the Gateway released the poll');
  await until(() => gw.requestsTo('state')[0]?.outcome === 'client_gone', 'recorded as client_gone');
  t.pass();
});

t.test('faults as a client sees them', async (t) => {
  const gw = await start(t);
  gw.inject({ kind: 'status5xx', status: 502 }, { endpoint: 'state' });
  t.equal((await getState(gw, '')).status, 502);
  gw.inject({ kind: 'status429', retryAfterS: 7 });
  const limited = await getState(gw, '');
  t.same([limited.status, limited.headers['retry-after']], [429, '7']);
  gw.inject({ kind: 'notJson' });
  const html = await getState(gw, '');
  t.equal(html.status, 200);
  t.same(parseDesiredState(html.text), { ok: false, error: 'invalid JSON' });
  gw.inject({ kind: 'badSchema' });
  t.notOk(parseDesiredState((await getState(gw, '')).text).ok);
  for (const [name, body] of [
    ['http upstream', craftedStates.httpUpstream(5)],
    ['http provider upstream', craftedStates.httpProviderUpstream(5)],
    ['reserved header', craftedStates.reservedHeader(5)],
    ['../ provider', craftedStates.dotdotProvider(5)],
    ['token path named', craftedStates.tokenPathNamed(5)],
  ] as const) {
    gw.inject({ kind: 'body', body });
    const r = await getState(gw, '');
    t.notOk(parseDesiredState(r.text).ok, `${name}: a host refuses it`);
  }
  gw.inject({ kind: 'dropBeforeCommit' }, { endpoint: 'state' });
  await t.rejects(getState(gw, ''), 'dropped: the socket is destroyed');
  gw.inject({ kind: 'dropAfterCommit' }, { endpoint: 'state' });
  await t.rejects(getState(gw, '?after=1'), 'a held poll cut');
  t.equal(gw.pendingFaults(), 0);
});

t.test('hang never answers; close() ends it', async (t) => {
  const gw = await MockHostGateway.start({ staticHosts: { h: CRED } });
  gw.inject({ kind: 'hang' });
  const pending = getState(gw, '').catch((e: unknown) => e);
  await until(() => gw.requests[0]?.outcome === 'hang', 'the request is hanging');
  await gw.close();
  t.type(await pending, Error, 'the client sees the connection end');
});

t.test('10 000 bindings: served by real connects and taken by the parser', async (t) => {
  const gw = await start(t);
  const many = craftedStates.manyBindings(0).bindings;
  gw.control.connectBindings(many);
  const r = await getState(gw, '?after=1');
  const parsed = parseDesiredState(r.text);
  t.ok(parsed.ok);
  if (parsed.ok) t.equal(Object.keys(parsed.value.bindings).length, 10_000);
  gw.inject({ kind: 'body', body: craftedStates.manyBindings(9) });
  t.ok(parseDesiredState((await getState(gw, '')).text).ok, 'the crafted body is valid too');
});
