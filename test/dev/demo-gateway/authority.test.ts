import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import t from 'tap';
import { RenewAuthority, type RenewResult } from '../../../src/dev/demo-gateway/authority.js';
import { renewConflictSchema, renewErrorSchema, renewOkSchema, type RenewOk } from '../../../src/data/renew-wire.js';

const CRED = 'host-cred-секрет-1';
const SLOT = 'instance:abc';
const LIFETIME = 60_000;

function setup(extra: { autoCreateSlots?: boolean; tokenValidity?: 'current' | 'until-expiry' } = {}): { a: RenewAuthority; clock: { now: number } } {
  const clock = { now: Date.parse('2030-01-01T00:00:00.000Z') };
  const a = new RenewAuthority({ credential: CRED, tokenLifetimeMs: LIFETIME, now: () => clock.now, slots: [SLOT], ...extra });
  return { a, clock };
}

function okBody(r: RenewResult): RenewOk {
  if (r.status !== 200) throw new Error(`expected 200, got ${r.status} ${JSON.stringify(r.body)}`);
  return renewOkSchema.parse(r.body);
}

function req(expectedTokenId: string | null, requestId = randomUUID()): { requestId: string; expectedTokenId: string | null } {
  return { requestId, expectedTokenId };
}

t.test('mint: a fresh slot renews with a null expectation', async (t) => {
  const { a, clock } = setup();
  t.same(a.slotState(SLOT), { slot: SLOT, tokenId: null, expiresAt: null, generation: 0, revoked: false });
  const r = a.renew(SLOT, CRED, req(null));
  const body = okBody(r);
  t.equal(body.slot, SLOT);
  t.equal(body.credentialGeneration, 1);
  t.equal(body.expiresAt, new Date(clock.now + LIFETIME).toISOString());
  t.match(body.token, /^gw_[A-Za-z0-9_-]{43}$/);
  t.not(body.token, body.tokenId, 'tokenId is not the token');
  t.equal(r.headers?.['cache-control'], 'no-store');
  t.same(a.slotState(SLOT), { slot: SLOT, tokenId: body.tokenId, expiresAt: body.expiresAt, generation: 1, revoked: false });

  const second = okBody(a.renew(SLOT, CRED, req(body.tokenId)));
  t.equal(second.credentialGeneration, 2);
  t.not(second.tokenId, body.tokenId);
  t.not(second.token, body.token);
  t.equal(a.stats().minted, 2);
});

t.test('idempotent replay: same answer, no second mint, whatever expectedTokenId says now', async (t) => {
  const { a, clock } = setup();
  const id = randomUUID();
  const first = okBody(a.renew(SLOT, CRED, req(null, id)));
  clock.now += 5_000;
  const again = okBody(a.renew(SLOT, CRED, req(null, id)));
  t.same(again, first, 'identical body, token included');
  const stale = okBody(a.renew(SLOT, CRED, req('tid_something_else', id)));
  t.same(stale, first, 'expectation ignored on replay');
  // The slot moved on meanwhile: the replay still returns the committed answer.
  const next = okBody(a.renew(SLOT, CRED, req(first.tokenId)));
  t.same(okBody(a.renew(SLOT, CRED, req(next.tokenId, id))), first);
  t.equal(a.mintedForRequest(id), 1);
  t.equal(a.stats().minted, 2);
  t.equal(a.stats().replays, 3);
  // Mutating an answer does not change the stored one.
  (again as { token: string }).token = 'tampered';
  t.equal(okBody(a.renew(SLOT, CRED, req(null, id))).token, first.token);
});

t.test('a requestId is scoped to its slot', async (t) => {
  const { a } = setup();
  a.createSlot('cli:notion');
  const id = randomUUID();
  const x = okBody(a.renew(SLOT, CRED, req(null, id)));
  const y = okBody(a.renew('cli:notion', CRED, req(null, id)));
  t.equal(y.slot, 'cli:notion');
  t.not(y.tokenId, x.tokenId);
  t.equal(a.mintedForRequest(id), 2, 'counted across slots');
});

t.test('CAS: a stale expectation gets 409 with currentTokenId, and the 409 is not stored', async (t) => {
  const { a } = setup();
  const first = okBody(a.renew(SLOT, CRED, req(null)));
  const id = randomUUID();
  const r = a.renew(SLOT, CRED, req(null, id));
  t.equal(r.status, 409);
  t.same(renewConflictSchema.parse(r.body), { error: 'token_conflict', currentTokenId: first.tokenId });
  const wrong = a.renew(SLOT, CRED, req('tid_not_current'));
  t.equal(wrong.status, 409);
  t.same(wrong.body, { error: 'token_conflict', currentTokenId: first.tokenId });
  t.equal(a.stats().conflicts, 2);
  t.equal(a.stats().minted, 1, 'a conflict mints nothing');
  t.equal(a.slotState(SLOT)?.tokenId, first.tokenId, 'state untouched');
  // Not a commit: the same requestId with the adopted expectation now succeeds.
  const adopted = okBody(a.renew(SLOT, CRED, req(first.tokenId, id)));
  t.equal(adopted.credentialGeneration, 2);
  t.equal(a.mintedForRequest(id), 1);
});

t.test('CAS: a non-null expectation on a fresh slot is a conflict with currentTokenId null', async (t) => {
  const { a } = setup();
  const r = a.renew(SLOT, CRED, req('tid_from_a_previous_life'));
  t.equal(r.status, 409);
  t.same(renewConflictSchema.parse(r.body), { error: 'token_conflict', currentTokenId: null });
  t.equal(a.stats().minted, 0);
});

t.test('401: missing or wrong credential, checked before everything (even a replay)', async (t) => {
  const { a } = setup();
  const id = randomUUID();
  okBody(a.renew(SLOT, CRED, req(null, id)));
  for (const bearer of [undefined, '', 'wrong', `${CRED}x`, CRED.slice(0, -1)]) {
    const r = a.renew(SLOT, bearer, req(null, id));
    t.equal(r.status, 401, JSON.stringify(bearer));
    t.same(r.body, { error: 'host_credential_invalid' });
  }
  t.equal(a.renew('instance:unknown', 'wrong', req(null)).status, 401, '401 before 404');
  t.equal(a.stats().unauthorized, 6);
  t.equal(a.stats().minted, 1);
});

t.test('credential rotation and invalidation', async (t) => {
  const { a } = setup();
  const tok = okBody(a.renew(SLOT, CRED, req(null)));
  a.setCredential('cred-2');
  t.equal(a.renew(SLOT, CRED, req(tok.tokenId)).status, 401, 'old credential refused');
  t.ok(a.isValidToken(tok.token), 'tokens survive a credential rotation');
  const next = okBody(a.renew(SLOT, 'cred-2', req(tok.tokenId)));
  a.setCredential((b) => b.startsWith('family-'));
  t.equal(okBody(a.renew(SLOT, 'family-9', req(next.tokenId))).credentialGeneration, 3);
  a.invalidateCredential();
  t.equal(a.renew(SLOT, 'family-9', req(null)).status, 401);
  t.throws(() => a.setCredential(''), RangeError);
});

t.test('404: unknown slot, revoked slot (replays included); autoCreate; re-create', async (t) => {
  const { a } = setup();
  const unknown = a.renew('cli:nope', CRED, req(null));
  t.equal(unknown.status, 404);
  t.same(renewErrorSchema.parse(unknown.body), { error: 'slot_not_found' });

  const id = randomUUID();
  const tok = okBody(a.renew(SLOT, CRED, req(null, id)));
  a.revokeSlot(SLOT);
  t.equal(a.renew(SLOT, CRED, req(tok.tokenId)).status, 404);
  t.equal(a.renew(SLOT, CRED, req(null, id)).status, 404, 'a replay of a revoked slot is 404 too');
  t.equal(a.isValidToken(tok.token), undefined, 'revocation invalidates tokens at once');
  t.equal(a.stats().notFound, 3);

  a.createSlot(SLOT);
  t.same(a.slotState(SLOT), { slot: SLOT, tokenId: null, expiresAt: null, generation: 1, revoked: false });
  t.equal(okBody(a.renew(SLOT, CRED, req(null))).credentialGeneration, 2, 'generation never goes back');

  const auto = setup({ autoCreateSlots: true }).a;
  t.equal(auto.renew('cli:github', CRED, req(null)).status, 200);
  auto.revokeSlot('cli:github');
  t.equal(auto.renew('cli:github', CRED, req(null)).status, 404, 'a revoked slot is not auto-created again');
  t.throws(() => a.createSlot('instance:a/b'));
  t.throws(() => a.createSlot('nope:x'));
});

t.test('isValidToken, strict (the default): a mint revokes the previous token of that slot at once', async (t) => {
  const { a, clock } = setup();
  const t1 = okBody(a.renew(SLOT, CRED, req(null)));
  t.same(a.isValidToken(t1.token), { slot: SLOT, tokenId: t1.tokenId, generation: 1 });
  clock.now += 1_000;
  const t2 = okBody(a.renew(SLOT, CRED, req(t1.tokenId)));
  t.equal(a.isValidToken(t1.token), undefined, 'old token refused the moment the new one is minted');
  t.same(a.isValidToken(t2.token), { slot: SLOT, tokenId: t2.tokenId, generation: 2 });
  a.createSlot('cli:other');
  const other = okBody(a.renew('cli:other', CRED, req(null)));
  t.ok(a.isValidToken(t2.token), 'a mint for another slot leaves this one alone');
  t.ok(a.isValidToken(other.token));
  a.mintElsewhere(SLOT);
  t.equal(a.isValidToken(t2.token), undefined, 'a renewal elsewhere revokes it too');
});

// Lenient on purpose: the expiry arithmetic of old tokens only exists under this rule.
t.test('isValidToken, until-expiry: old and new valid until their own expiry; then invalid', async (t) => {
  const { a, clock } = setup({ tokenValidity: 'until-expiry' });
  const t1 = okBody(a.renew(SLOT, CRED, req(null)));
  t.same(a.isValidToken(t1.token), { slot: SLOT, tokenId: t1.tokenId, generation: 1 });
  clock.now += 40_000;
  const t2 = okBody(a.renew(SLOT, CRED, req(t1.tokenId)));
  t.same(a.isValidToken(t1.token), { slot: SLOT, tokenId: t1.tokenId, generation: 1 }, 'old still valid');
  t.same(a.isValidToken(t2.token), { slot: SLOT, tokenId: t2.tokenId, generation: 2 });
  clock.now += 19_999;
  t.ok(a.isValidToken(t1.token), 'valid 1 ms before expiry');
  clock.now += 1;
  t.equal(a.isValidToken(t1.token), undefined, 'invalid at expiresAt');
  t.ok(a.isValidToken(t2.token));
  clock.now += 40_000;
  t.equal(a.isValidToken(t2.token), undefined);
  t.equal(a.isValidToken(t1.tokenId), undefined, 'a tokenId is not a token');
  t.equal(a.isValidToken('gw_made_up'), undefined);
});

t.test('mintElsewhere makes the host expectation stale', async (t) => {
  const { a } = setup();
  const mine = okBody(a.renew(SLOT, CRED, req(null)));
  const other = a.mintElsewhere(SLOT);
  t.equal(other.generation, 2);
  const r = a.renew(SLOT, CRED, req(mine.tokenId));
  t.same(r.body, { error: 'token_conflict', currentTokenId: other.tokenId });
  t.equal(okBody(a.renew(SLOT, CRED, req(other.tokenId))).credentialGeneration, 3);
  t.same(a.stats(), {
    minted: 2,
    renewCalls: 3,
    replays: 0,
    conflicts: 1,
    unauthorized: 0,
    notFound: 0,
    mintedElsewhere: 1,
    perSlotMinted: { [SLOT]: 2 },
  });
  t.throws(() => a.mintElsewhere('cli:unknown'));
});

t.test('stats count every call by outcome', async (t) => {
  const { a } = setup();
  a.createSlot('cli:x');
  const id = randomUUID();
  const x1 = okBody(a.renew('cli:x', CRED, req(null, id)));
  a.renew('cli:x', CRED, req(null, id)); // replay
  a.renew('cli:x', CRED, req(null)); // conflict
  a.renew('cli:x', 'bad', req(null)); // 401
  a.renew('cli:gone', CRED, req(null)); // 404
  okBody(a.renew('cli:x', CRED, req(x1.tokenId)));
  okBody(a.renew(SLOT, CRED, req(null)));
  t.same(a.stats(), {
    minted: 3,
    renewCalls: 7,
    replays: 1,
    conflicts: 1,
    unauthorized: 1,
    notFound: 1,
    mintedElsewhere: 0,
    perSlotMinted: { 'cli:x': 2, [SLOT]: 1 },
  });
});

t.test('no secret leaks through serialisation or inspection', async (t) => {
  const { a } = setup();
  const tok = okBody(a.renew(SLOT, CRED, req(null)));
  const seen = [JSON.stringify(a), inspect(a, { depth: 10, showHidden: true }), JSON.stringify(a.stats()), JSON.stringify(a.slotState(SLOT))];
  for (const s of seen) {
    t.notOk(s.includes(tok.token), 'no token');
    t.notOk(s.includes(CRED), 'no credential');
  }
});

t.test('constructor validation', async (t) => {
  t.throws(() => new RenewAuthority({ credential: CRED, tokenLifetimeMs: 0 }), RangeError);
  t.throws(() => new RenewAuthority({ credential: '', tokenLifetimeMs: 1000 }), RangeError);
  t.throws(() => new RenewAuthority({ credential: CRED, tokenLifetimeMs: 1000, tokenPrefix: 'a b' }), RangeError);
});
