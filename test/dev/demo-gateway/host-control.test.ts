import t from 'tap';
import { RenewAuthority } from '../../../src/dev/demo-gateway/authority.js';
import { HostControl } from '../../../src/dev/demo-gateway/host-control.js';
import type { EnrollOk, EnrollRequest } from '../../../src/data/link-wire.js';
import type { DesiredState } from '../../../src/data/desired-state.js';

const RID1 = '11111111-1111-4111-8111-111111111111';
const RID2 = '22222222-2222-4222-8222-222222222222';
const B1 = 'bind_host_ctl_01';
const B2 = 'bind_host_ctl_02';
const binding = { instanceId: 'inst-a', upstreamUrl: 'https://gw.example.com/mcp/a' };
const provider = { upstream: 'https://api.example.com', inject: { type: 'header' as const, name: 'Authorization', value: 'Bearer {token}' }, commands: [] };

function rig(options: { longPollMs?: number; now?: () => number } = {}) {
  const authority = new RenewAuthority({ credential: () => false, tokenLifetimeMs: 60_000 });
  const control = new HostControl({ authority, staticHosts: { 'static-host': 'static-cred' }, ...options });
  return { authority, control };
}

function req(code: string, requestId = RID1): EnrollRequest {
  return { requestId, code, host: { hostname: 'box', version: '0.1.0' } };
}

function okBody(r: { status: number; body?: unknown }): EnrollOk {
  if (r.status !== 200) throw new Error(`expected 200, got ${r.status}`);
  return r.body as EnrollOk;
}

t.test('enrol: a code is one-time; a retry of the same requestId gets the same credential', async (t) => {
  const { control } = rig();
  const code = control.issuePairingCode();
  t.match(code, /^[A-Z2-9]{4}-[A-Z2-9]{4}-[A-Z2-9]{4}$/);
  const first = okBody(control.enroll(req(code)));
  t.match(first.credential, /^hc_/);
  t.same(okBody(control.enroll(req(code))), first, 'replay answers the same hostId and credential');
  t.same(control.enroll(req(code, RID2)), { status: 401, body: { error: 'code_invalid' }, headers: { 'cache-control': 'no-store' } }, 'another requestId: code used');
  t.equal(control.enroll(req('WXYZ-2345-6789', RID2)).status, 401, 'unknown code');
  const other = control.issuePairingCode();
  t.equal(control.enroll(req(other, RID1)).status, 401, 'a known requestId with another code is refused');
  t.equal(control.stats().enrolled, 1);
  t.equal(control.stats().enrollReplays, 1);
  t.equal(control.hosts().filter((h) => h.hostname === 'box').length, 1);
  t.notMatch(JSON.stringify(control), first.credential, 'serialising shows no secret');
});

t.test('enrol: an expired code is refused; a revoked host cannot replay its enrolment', async (t) => {
  let now = 1_000_000;
  const { control } = rig({ now: () => now });
  const code = control.issuePairingCode({ ttlMs: 1_000 });
  now += 1_000;
  t.equal(control.enroll(req(code)).status, 401, 'expired');
  const fresh = control.issuePairingCode();
  const ok = okBody(control.enroll(req(fresh, RID2)));
  control.revokeHost(ok.hostId);
  t.equal(control.enroll(req(fresh, RID2)).status, 401, 'replay after revocation');
  t.equal(control.hostOf(ok.credential), undefined);
});

t.test('the credential it mints is the one the renewal authority accepts', async (t) => {
  const { control, authority } = rig();
  const { credential, hostId } = okBody(control.enroll(req(control.issuePairingCode())));
  control.connectBinding(B1, binding);
  const body = { requestId: RID1, expectedTokenId: null };
  t.equal(authority.renew('instance:inst-a', credential, body).status, 200, 'enrolled credential renews');
  t.equal(authority.renew('instance:inst-a', 'static-cred', { ...body, requestId: RID2 }).status, 409, 'static credential passes the credential check');
  t.equal(authority.renew('instance:inst-a', 'hc_wrong', body).status, 401, 'an unknown credential does not');
  control.revokeHost(hostId);
  t.equal(authority.renew('instance:inst-a', credential, body).status, 401, 'a revoked host cannot renew');
});

t.test('connect and disconnect bump the version and create or revoke the slot', async (t) => {
  const { control, authority } = rig();
  t.equal(control.version, 1);
  control.connectBinding(B1, binding);
  control.connectBinding(B2, { ...binding, upstreamUrl: 'https://gw.example.com/mcp/b' });
  control.connectProvider('notion', provider);
  t.equal(control.version, 4);
  t.same(Object.keys(control.state().bindings).sort(), [B1, B2]);
  t.equal(authority.slotState('instance:inst-a')?.revoked, false);
  t.equal(authority.slotState('cli:notion')?.revoked, false);

  control.disconnectBinding(B1);
  t.equal(authority.slotState('instance:inst-a')?.revoked, false, 'another binding still uses the instance');
  control.disconnectBinding(B2);
  t.equal(authority.slotState('instance:inst-a')?.revoked, true, 'last binding of the instance gone: slot revoked');
  control.disconnectProvider('notion');
  t.equal(authority.slotState('cli:notion')?.revoked, true);
  t.equal(control.version, 7);
  control.disconnectProvider('notion');
  t.equal(control.version, 7, 'disconnecting what is not there changes nothing');

  control.connectBinding(B1, binding);
  t.equal(authority.slotState('instance:inst-a')?.revoked, false, 'reconnect revives the slot');
});

t.test('the stand-in never serves an invalid state', async (t) => {
  const { control } = rig();
  t.throws(() => control.connectBinding(B1, { ...binding, upstreamUrl: 'http://gw.example.com/' }));
  t.throws(() => control.connectProvider('..', provider));
  t.throws(() => control.connectProvider('x', { ...provider, inject: { type: 'header', name: 'Host', value: '{token}' } }));
  t.equal(control.version, 1, 'nothing changed');
});

t.test('state poll: at once when behind, waits when current, wakes on a change', async (t) => {
  const { control } = rig();
  const now = await control.pollState('static-cred', 0);
  t.equal(now.status, 200);
  t.equal((now.body as DesiredState).version, 1);
  t.equal((await control.pollState('static-cred', 99)).status, 200, 'a host ahead (Gateway reset) gets the state at once');

  const waiting = control.pollState('static-cred', 1);
  t.equal(control.waitingPolls, 1, 'held');
  control.connectBinding(B1, binding);
  const woke = await waiting;
  t.equal(woke.status, 200);
  t.equal((woke.body as DesiredState).version, 2);
  t.same((woke.body as DesiredState).bindings[B1], binding);
  t.equal(control.waitingPolls, 0);
});

t.test('state poll: 204 after the hold time; released when the client leaves; 401 for a bad or revoked credential', async (t) => {
  const { control } = rig({ longPollMs: 30 });
  t.same(await control.pollState('static-cred', 1), { status: 204, headers: { 'cache-control': 'no-store' } });
  const gone = new AbortController();
  const p = control.pollState('static-cred', 1, gone.signal);
  gone.abort();
  await p;
  t.equal(control.waitingPolls, 0, 'no listener left behind');
  t.equal((await control.pollState('nope', 0)).status, 401);
  t.equal((await control.pollState(undefined, 0)).status, 401);

  const { control: c2 } = rig();
  const { hostId, credential } = okBody(c2.enroll(req(c2.issuePairingCode())));
  const held = c2.pollState(credential, 1);
  c2.revokeHost(hostId);
  t.equal((await held).status, 401, 'revoked while waiting');
  t.throws(() => new HostControl({ authority: new RenewAuthority({ credential: 'x', tokenLifetimeMs: 1 }), longPollMs: 60_001 }), 'hold capped at 60 s');
});

t.test('presence is stored under the credential’s host', async (t) => {
  const { control } = rig();
  const body = { hostId: 'static-host', version: '0.1.0', stateVersion: 1, parts: { forwarder: 'ok' as const }, slots: [], problems: [] };
  t.same(control.presence('static-cred', body), { status: 204 });
  t.equal(control.presence('wrong', body).status, 401);
  t.equal(control.presences.length, 1);
  t.equal(control.presences[0]?.hostId, 'static-host');
});

t.test('audit: stored once per event id, a repeat accepted and counted; dropped keeps the largest; 401 without a live credential', async (t) => {
  const { control } = rig();
  const event = (id: string) => ({ id, time: '2026-01-01T00:00:00.000Z', provider: 'saas', method: 'GET', path: '/x', status: 200, bytesIn: 0, bytesOut: 1, durationMs: 1, peerUid: 0 });
  const a = event(RID1);
  const b = event(RID2);
  t.same(control.audit('static-cred', { events: [a], dropped: 2 }).body, { accepted: 1 });
  t.same(control.audit('static-cred', { events: [a, b], dropped: 1 }).body, { accepted: 2 }, 'a repeat counts as accepted');
  t.same(control.auditEvents.map((r) => r.event.id), [RID1, RID2], 'each stored once');
  t.equal(control.stats().auditRepeats, 1);
  t.equal(control.auditDropped.get('static-host'), 2, 'the largest dropped count reported');
  t.equal(control.audit('wrong', { events: [a], dropped: 0 }).status, 401);
});
