import t from 'tap';
import { RenewPool } from '../../../src/link/renewal/renew-pool.js';

const ok = { overloaded: false, latencyMs: 10 };

t.test('starts at the bound and never lets more in flight', async (t) => {
  const pool = new RenewPool({ max: 3 });
  for (let i = 0; i < 3; i++) t.ok(await pool.acquire(), `place ${i + 1}`);
  let fourth = false;
  const waiting = pool.acquire().then((v) => (fourth = v));
  await new Promise((r) => setImmediate(r));
  t.notOk(fourth, 'the fourth waits');
  pool.release(ok);
  await waiting;
  t.ok(fourth, 'and starts once one is released');
  t.equal(pool.inflight, 3);
  pool.close();
});

t.test('a 429 halves the bound once per cool-down, successes grow it back to the bound', async (t) => {
  let now = 1_000_000;
  const pool = new RenewPool({ max: 8, coolMs: 1_000, now: () => now });
  for (let i = 0; i < 8; i++) await pool.acquire();
  pool.release({ overloaded: true, latencyMs: 5 });
  t.equal(pool.limit, 4, 'halved');
  pool.release({ overloaded: true, latencyMs: 5 });
  t.equal(pool.limit, 4, 'one burst of 429s is one signal');
  now += 1_000;
  pool.release({ overloaded: true, latencyMs: 5 });
  t.equal(pool.limit, 2, 'halved again after the cool-down');
  for (let i = 0; i < 5; i++) pool.release(ok);
  t.ok(pool.limit > 2, `grows with successes (${pool.limit})`);
  for (let i = 0; i < 200; i++) {
    await pool.acquire();
    pool.release(ok);
  }
  t.equal(pool.limit, 8, 'back to the bound, never above it');
  pool.close();
});

t.test('a slow answer counts as the Gateway struggling', async (t) => {
  const pool = new RenewPool({ max: 16, slowMs: 100 });
  await pool.acquire();
  pool.release({ overloaded: false, latencyMs: 150 });
  t.equal(pool.limit, 8);
  pool.close();
});

t.test('Retry-After holds every start until it has passed', async (t) => {
  let now = 5_000;
  const pool = new RenewPool({ max: 4, now: () => now });
  await pool.acquire();
  pool.release({ overloaded: true, retryAfterMs: 60_000, latencyMs: 1 });
  t.equal(pool.pausedUntil, 65_000);
  const ac = new AbortController();
  let started: boolean | undefined;
  const waiting = pool.acquire(ac.signal).then((v) => (started = v));
  await new Promise((r) => setImmediate(r));
  t.equal(started, undefined, 'nothing starts during the pause, though places are free');
  now = 65_000;
  // The pause timer runs on the real clock; an abort stands in for it here.
  ac.abort();
  await waiting;
  t.equal(started, false, 'an abort ends the wait without a place');
  t.equal(pool.inflight, 0);
  t.ok(await pool.acquire(), 'after the pause a place is given');
  pool.close();
});
