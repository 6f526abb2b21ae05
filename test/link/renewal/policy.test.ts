import t from 'tap';
import type { RenewOutcome } from '../../../src/link/renewal/renew-slot.js';
import type { RenewalSlotState } from '../../../src/link/renewal/renewal-state.js';
import type { SlotFile } from '../../../src/data/handoff.js';
import {
  REVOKED_PAUSE_MS,
  afterCredentialChange,
  credentialDigest,
  credentialGate,
  decide,
  dueAt,
  freshSlot,
  type Decision,
  type SlotPolicyState,
} from '../../../src/link/renewal/policy.js';

const NOW = Date.parse('2030-01-01T00:00:00Z');
const backoff = { baseMs: 1_000, capMs: 60_000 };
/** The top of every jitter range: the table shows the ceilings, deterministic. */
const top = (): number => 0.999_999;
const options = { backoff, rand: top };

function next(d: Decision): Extract<Decision, { kind: 'next' }> {
  if (d.kind !== 'next') throw new Error(`expected a next attempt, got ${d.kind}`);
  return d;
}

const failure = (retryAfterMs?: number): RenewOutcome => ({ kind: 'retry', reason: 'status 503', ...(retryAfterMs === undefined ? {} : { retryAfterMs }) });
const conflict: RenewOutcome = { kind: 'conflict', currentTokenId: 'tid_other' };

t.test('one decision per outcome', async (t) => {
  const renewAt = NOW + 60_000 - 0.999_999 * 9_000;
  const rows: Array<{ name: string; state: SlotPolicyState; outcome: RenewOutcome; want: Decision }> = [
    {
      name: '200: settled, next renewal at two thirds of the new lifetime (minus jitter)',
      state: { attempt: 3, notBefore: NOW, settled: false },
      outcome: { kind: 'renewed', tokenId: 'tid_1', expiresAt: new Date(NOW + 90_000).toISOString() },
      // 2/3 of 90 s = 60 s, moved earlier by up to a tenth of the lifetime (9 s).
      want: { kind: 'next', state: freshSlot, at: renewAt, delayMs: renewAt - NOW },
    },
    {
      name: '409, first in a row: renew again at once',
      state: freshSlot,
      outcome: conflict,
      want: { kind: 'next', state: { attempt: 1, notBefore: NOW, settled: false }, at: NOW, delayMs: 0 },
    },
    {
      name: '409, second in a row: still at once',
      state: { attempt: 1, notBefore: NOW, settled: false },
      outcome: conflict,
      want: { kind: 'next', state: { attempt: 2, notBefore: NOW, settled: false }, at: NOW, delayMs: 0 },
    },
    {
      name: '409, third in a row: backs off (two hosts fighting over one slot)',
      state: { attempt: 2, notBefore: NOW, settled: false },
      outcome: conflict,
      want: { kind: 'next', state: { attempt: 3, notBefore: NOW + 1_999, settled: false }, at: NOW + 1_999, delayMs: 1_999 },
    },
    {
      name: '401: halt',
      state: { attempt: 2, notBefore: 0, settled: false },
      outcome: { kind: 'credential_invalid' },
      want: { kind: 'halt' },
    },
    {
      name: '404: revoked, settled, left alone for the pause',
      state: { attempt: 4, notBefore: 0, settled: false },
      outcome: { kind: 'revoked' },
      want: { kind: 'next', state: { attempt: 0, notBefore: NOW + REVOKED_PAUSE_MS, settled: true }, at: NOW + REVOKED_PAUSE_MS, delayMs: REVOKED_PAUSE_MS },
    },
    {
      name: '503, first failure: backoff ceiling base·2',
      state: freshSlot,
      outcome: failure(),
      want: { kind: 'next', state: { attempt: 1, notBefore: NOW + 1_999, settled: false }, at: NOW + 1_999, delayMs: 1_999 },
    },
    {
      name: '503, fourth failure: base·2^4',
      state: { attempt: 3, notBefore: 0, settled: false },
      outcome: failure(),
      want: { kind: 'next', state: { attempt: 4, notBefore: NOW + 15_999, settled: false }, at: NOW + 15_999, delayMs: 15_999 },
    },
    {
      name: '503 after many failures: capped',
      state: { attempt: 40, notBefore: 0, settled: false },
      outcome: failure(),
      want: { kind: 'next', state: { attempt: 41, notBefore: NOW + 59_999, settled: false }, at: NOW + 59_999, delayMs: 59_999 },
    },
    {
      name: '429 with Retry-After longer than the backoff: Retry-After wins',
      state: freshSlot,
      outcome: failure(30_000),
      want: { kind: 'next', state: { attempt: 1, notBefore: NOW + 30_000, settled: false }, at: NOW + 30_000, delayMs: 30_000 },
    },
    {
      name: 'Retry-After beyond the cap is still honoured',
      state: freshSlot,
      outcome: failure(120_000),
      want: { kind: 'next', state: { attempt: 1, notBefore: NOW + 120_000, settled: false }, at: NOW + 120_000, delayMs: 120_000 },
    },
  ];
  for (const row of rows) t.strictSame(decide(row.state, row.outcome, NOW, options), row.want, row.name);
});

t.test('a 409 storm backs off more and more, and a 200 ends it', async (t) => {
  let state = freshSlot;
  const delays: number[] = [];
  for (let i = 0; i < 8; i++) {
    const d = next(decide(state, conflict, NOW, options));
    delays.push(d.delayMs);
    state = d.state;
  }
  t.strictSame(delays, [0, 0, 1_999, 3_999, 7_999, 15_999, 31_999, 59_999], 'two at once, then doubling up to the cap');
  t.notOk(state.settled, 'still owed');
  const ok = next(decide(state, { kind: 'renewed', tokenId: 'tid_2', expiresAt: new Date(NOW + 60_000).toISOString() }, NOW, options));
  t.strictSame(ok.state, freshSlot, 'a 200 forgets the storm');
});

t.test('jitter stays within [0, ceiling) and never below Retry-After', async (t) => {
  for (const r of [0, 0.25, 0.5, 0.999]) {
    const d = next(decide({ attempt: 2, notBefore: 0, settled: false }, failure(), NOW, { backoff, rand: () => r }));
    t.ok(d.delayMs >= 0 && d.delayMs < 8_000, `rand ${r}: ${d.delayMs} in [0, 8000)`);
    const withRetryAfter = next(decide(freshSlot, failure(5_000), NOW, { backoff, rand: () => r }));
    t.ok(withRetryAfter.delayMs >= 5_000, `rand ${r}: not sooner than Retry-After`);
  }
});

t.test('the credential gate: 401 halts, the same credential stays halted, a new one resumes', async (t) => {
  const refused = credentialDigest('host-cred-old');
  const rows: Array<{ name: string; haltedOn: string | undefined; credential: string; want: string }> = [
    { name: 'never halted', haltedOn: undefined, credential: 'host-cred-old', want: 'run' },
    { name: 'halted, same credential', haltedOn: refused, credential: 'host-cred-old', want: 'halted' },
    { name: 'halted, credential replaced', haltedOn: refused, credential: 'host-cred-new', want: 'resume' },
  ];
  for (const row of rows) t.equal(credentialGate(row.haltedOn, credentialDigest(row.credential)), row.want, row.name);
  t.notMatch(refused, /host-cred/, 'the halt keeps a digest, not the credential');
});

t.test('a credential change forgets failures but keeps a revocation pause', async (t) => {
  const failing: SlotPolicyState = { attempt: 5, notBefore: NOW + 30_000, settled: false };
  const revoked: SlotPolicyState = { attempt: 0, notBefore: NOW + REVOKED_PAUSE_MS, settled: true };
  t.strictSame(afterCredentialChange(failing), freshSlot, 'failing slot: retried at once with the new credential');
  t.strictSame(afterCredentialChange(revoked), revoked, 'revoked slot: still left alone');
});

t.test('when a slot is due', async (t) => {
  const slot = (over: Partial<SlotFile> = {}): SlotFile => ({ slot: 'instance:a', tokenId: null, expiresAt: null, generation: 0, ...over });
  const saved = (over: Partial<RenewalSlotState> = {}): RenewalSlotState => ({ slot: 'instance:a', ...over });
  const applied = slot({
    tokenId: 'tid_1',
    generation: 1,
    appliedAt: new Date(NOW).toISOString(),
    expiresAt: new Date(NOW + 90_000).toISOString(),
  });
  const mid = (): number => 0;
  const rows: Array<{ name: string; slot: SlotFile; saved: RenewalSlotState; state: SlotPolicyState; want: number }> = [
    { name: 'no token: at once', slot: slot(), saved: saved(), state: freshSlot, want: 0 },
    { name: 'applied token: at two thirds of its lifetime', slot: applied, saved: saved(), state: freshSlot, want: NOW + 60_000 },
    {
      name: 'a renewal in flight (persisted requestId): at once',
      slot: applied,
      saved: saved({ pending: { requestId: '00000000-0000-4000-8000-000000000000', expectedTokenId: 'tid_1', since: new Date(NOW).toISOString() } }),
      state: freshSlot,
      want: 0,
    },
    { name: 'a tokenId adopted from a 409: at once', slot: applied, saved: saved({ adopted: 'tid_9' }), state: freshSlot, want: 0 },
    {
      name: 'delivered but not yet applied: scheduled by the delivered token',
      slot: applied,
      saved: saved({ delivered: { tokenId: 'tid_2', generation: 2, receivedAt: new Date(NOW + 60_000).toISOString(), expiresAt: new Date(NOW + 150_000).toISOString() } }),
      state: freshSlot,
      want: NOW + 120_000,
    },
    {
      name: 'in flight, but backing off: not before the backoff',
      slot: applied,
      saved: saved({ adopted: 'tid_9' }),
      state: { attempt: 3, notBefore: NOW + 4_000, settled: false },
      want: NOW + 4_000,
    },
  ];
  for (const row of rows) t.equal(dueAt(row.slot, row.saved, row.state, mid), row.want, row.name);
});
