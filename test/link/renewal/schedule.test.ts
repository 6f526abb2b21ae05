import t from 'tap';
import { backoffDelay, defaultBackoff, parseRetryAfter, renewDueAt, type BackoffOptions } from '../../../src/link/renewal/schedule.js';

const ISSUED = Date.UTC(2030, 0, 1, 12, 0, 0);
const LIFETIME = 60 * 60_000; // one hour
const EXPIRES = ISSUED + LIFETIME;
/** The largest double below 1: what Math.random can return at most. */
const ALMOST_ONE = 1 - Number.EPSILON / 2;

t.test('renewDueAt: at once without a token or with an unknown lifetime', async (t) => {
  const never = (): number => {
    throw new Error('rand must not be needed');
  };
  t.equal(renewDueAt({ tokenId: null, expiresAt: null, issuedAt: null }, never), 0, 'fresh slot');
  t.equal(renewDueAt({ tokenId: null, expiresAt: EXPIRES, issuedAt: ISSUED }, never), 0, 'no token even with times');
  t.equal(renewDueAt({ tokenId: 'tok-1', expiresAt: null, issuedAt: ISSUED }, never), 0, 'unknown expiry');
  t.equal(renewDueAt({ tokenId: 'tok-1', expiresAt: EXPIRES, issuedAt: null }, never), 0, 'unknown issue time');
  t.equal(renewDueAt({ tokenId: 'tok-1', expiresAt: ISSUED, issuedAt: ISSUED }, never), 0, 'zero lifetime');
  t.equal(renewDueAt({ tokenId: 'tok-1', expiresAt: ISSUED - 1000, issuedAt: ISSUED }, never), 0, 'negative lifetime');
});

t.test('renewDueAt: two thirds into the lifetime, moved earlier by at most a tenth', async (t) => {
  const times = { tokenId: 'tok-1', expiresAt: EXPIRES, issuedAt: ISSUED };
  const latest = ISSUED + (LIFETIME * 2) / 3;
  const earliest = latest - LIFETIME / 10;
  t.equal(renewDueAt(times, () => 0), latest, 'rand 0: exactly when a third is left');
  t.equal(renewDueAt(times, () => 0.5), latest - LIFETIME / 20, 'rand 0.5: half a tenth earlier');
  const nearOne = renewDueAt(times, () => ALMOST_ONE);
  t.ok(nearOne >= earliest, `rand→1 is not earlier than 2/3 − 1/10 (${nearOne - earliest} ms)`);
  t.ok(nearOne - earliest < 1, 'rand→1 is within a millisecond of 2/3 − 1/10');
  t.equal(renewDueAt(times, () => 1), earliest, 'the bound itself');
});

t.test('renewDueAt: never after expiry − lifetime/3, never before issue, for many lifetimes and draws', async (t) => {
  let checked = 0;
  for (const lifetime of [3, 1_000, 60_000, 200, 7 * 24 * 3600_000, 86_399_999]) {
    for (let i = 0; i <= 20; i++) {
      const r = i === 20 ? ALMOST_ONE : i / 20;
      const due = renewDueAt({ tokenId: 'x', issuedAt: ISSUED, expiresAt: ISSUED + lifetime }, () => r);
      const deadline = ISSUED + lifetime - lifetime / 3;
      if (due > deadline + 0.01 || due < ISSUED + lifetime / 2 || due < ISSUED) {
        t.fail(`lifetime ${lifetime} rand ${r}: due ${due - ISSUED} ms after issue, deadline ${deadline - ISSUED}`);
      }
      checked++;
    }
  }
  t.equal(checked, 6 * 21);
});

t.test('renewDueAt: uses the injected rand (different draws, different times)', async (t) => {
  const times = { tokenId: 'tok-1', expiresAt: EXPIRES, issuedAt: ISSUED };
  let calls = 0;
  const a = renewDueAt(times, () => {
    calls++;
    return 0.1;
  });
  const b = renewDueAt(times, () => 0.9);
  t.equal(calls, 1, 'rand drawn once');
  t.ok(b < a, 'a larger draw renews earlier');
  t.equal(a - b, 0.8 * (LIFETIME / 10));
});

t.test('backoffDelay: full jitter in [0, min(cap, base·2^attempt)) for attempts 0..40', async (t) => {
  const opts: BackoffOptions = { baseMs: 1_000, capMs: 5 * 60_000 };
  for (let attempt = 0; attempt <= 40; attempt++) {
    const ceiling = Math.min(opts.capMs, opts.baseMs * 2 ** attempt);
    const low = backoffDelay(attempt, undefined, opts, () => 0);
    const high = backoffDelay(attempt, undefined, opts, () => ALMOST_ONE);
    const mid = backoffDelay(attempt, undefined, opts, () => 0.5);
    if (low !== 0) t.fail(`attempt ${attempt}: rand 0 gives ${low}, want 0`);
    if (!(high < ceiling && high >= ceiling - 1)) t.fail(`attempt ${attempt}: rand→1 gives ${high}, want just under ${ceiling}`);
    if (mid !== Math.floor(ceiling / 2)) t.fail(`attempt ${attempt}: rand 0.5 gives ${mid}, want ${Math.floor(ceiling / 2)}`);
    if (!Number.isFinite(high) || !Number.isInteger(high)) t.fail(`attempt ${attempt}: ${high} is not a finite integer`);
  }
  t.equal(backoffDelay(0, undefined, opts, () => 0.5), 500, 'attempt 0: up to base');
  t.equal(backoffDelay(3, undefined, opts, () => 0.5), 4_000, 'attempt 3: up to 8 s');
  t.equal(backoffDelay(8, undefined, opts, () => 0.5), 128_000, 'attempt 8: up to 256 s');
  t.equal(backoffDelay(9, undefined, opts, () => 0.5), 150_000, 'attempt 9: capped at 5 min');
  t.equal(backoffDelay(40, undefined, opts, () => 0.5), 150_000, 'attempt 40: still capped, no overflow');
  t.equal(backoffDelay(1_000, undefined, opts, () => 0.5), 150_000, 'attempt 1000: still capped');
});

t.test('backoffDelay: the default cap is 5 minutes', async (t) => {
  t.equal(defaultBackoff.capMs, 5 * 60_000);
  for (const attempt of [10, 20, 40]) {
    const d = backoffDelay(attempt, undefined, undefined, () => ALMOST_ONE);
    t.ok(d < 5 * 60_000 && d >= 5 * 60_000 - 1, `attempt ${attempt}: ${d}`);
  }
  t.equal(backoffDelay(0, undefined, undefined, () => 0.5), defaultBackoff.baseMs / 2);
});

t.test('backoffDelay: Retry-After is a floor, even above the cap', async (t) => {
  const opts: BackoffOptions = { baseMs: 100, capMs: 1_000 };
  t.equal(backoffDelay(0, 7_000, opts, () => 0), 7_000, 'above the cap: honoured');
  t.equal(backoffDelay(40, 60 * 60_000, opts, () => ALMOST_ONE), 60 * 60_000, 'an hour: honoured');
  t.equal(backoffDelay(5, 200, opts, () => 0.5), 500, 'below the jitter: the jitter wins');
  t.equal(backoffDelay(5, 200, opts, () => 0), 200, 'jitter 0: Retry-After wins');
  t.equal(backoffDelay(2, 0, opts, () => 0.5), 200, 'Retry-After 0 is no floor');
});

t.test('backoffDelay: uses the injected rand', async (t) => {
  const opts: BackoffOptions = { baseMs: 1_000, capMs: 60_000 };
  const draws = [0.1, 0.7, 0.3];
  const seen = draws.map((r) => backoffDelay(4, undefined, opts, () => r));
  t.strictSame(seen, [1_600, 11_200, 4_800]);
});

t.test('parseRetryAfter: delta-seconds', async (t) => {
  const now = Date.UTC(2030, 0, 1);
  t.equal(parseRetryAfter('0', now), 0);
  t.equal(parseRetryAfter('7', now), 7_000);
  t.equal(parseRetryAfter(' 120 ', now), 120_000, 'surrounding whitespace tolerated');
  t.equal(parseRetryAfter('3600', now), 3_600_000);
});

t.test('parseRetryAfter: HTTP date, relative to the injected now', async (t) => {
  const now = Date.UTC(2030, 0, 1, 12, 0, 0);
  t.equal(parseRetryAfter('Tue, 01 Jan 2030 12:00:30 GMT', now), 30_000);
  t.equal(parseRetryAfter(new Date(now + 90_000).toUTCString(), now), 90_000);
  t.equal(parseRetryAfter(new Date(now + 90_000).toUTCString(), now + 60_000), 30_000, 'uses now, not the wall clock');
  t.equal(parseRetryAfter('Tue, 01 Jan 2030 11:59:00 GMT', now), 0, 'a date in the past: no wait, never negative');
});

t.test('parseRetryAfter: absent or garbage → undefined', async (t) => {
  const now = Date.UTC(2030, 0, 1);
  for (const v of [undefined, '', '   ', 'soon', '1s', '5 seconds', '0x10', 'Infinity', '1e3', 'NaN']) {
    t.equal(parseRetryAfter(v, now), undefined, JSON.stringify(v));
  }
});

t.test('parseRetryAfter: text that is neither delta-seconds nor an HTTP date is garbage too', async (t) => {
  // V8's Date.parse is lenient: it reads "-1" and "1.5" as dates in 2001 and
  // "retry 2099" as 1 Jan 2099. None is a valid Retry-After (RFC 9110 §10.2.3); the last
  // would hold a slot's renewal back for decades.
  const now = Date.UTC(2030, 0, 1);
  for (const v of ['-1', '1.5', 'retry 2099', 'soon 3000']) {
    t.equal(parseRetryAfter(v, now), undefined, JSON.stringify(v));
  }
});

t.test('parseRetryAfter: a repeated header uses its first value', async (t) => {
  const now = Date.UTC(2030, 0, 1, 12, 0, 0);
  t.equal(parseRetryAfter(['5', '99'], now), 5_000);
  t.equal(parseRetryAfter(['Tue, 01 Jan 2030 12:00:10 GMT', '1'], now), 10_000);
  t.equal(parseRetryAfter(['garbage', '5'], now), undefined);
  t.equal(parseRetryAfter([], now), undefined, 'empty array');
});
