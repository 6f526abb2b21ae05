import { setTimeout as sleep } from 'node:timers/promises';
import t from 'tap';
import { runLoop } from '../../src/service/loop.js';
import { memoryLogger } from '../support/memory-log.js';
import { within } from '../support/poll.js';

/** A long wait the tests never sit through: if it is not cut short, the test notices. */
const LONG = 60_000;
/** How long "nothing happened" is watched for. Only ever asserts absence of an event. */
const QUIET = 80;

/** Counts step calls and lets a test await the n-th one. */
class Steps {
  calls = 0;
  readonly events: string[] = [];
  private waiters: Array<{ n: number; resolve: () => void }> = [];

  constructor(private readonly body: (n: number) => Promise<number | 'done'> | number | 'done') {}

  readonly step = async (): Promise<number | 'done'> => {
    this.calls += 1;
    const n = this.calls;
    this.events.push(`step${n}`);
    for (const w of this.waiters.filter((w) => w.n <= n)) w.resolve();
    this.waiters = this.waiters.filter((w) => w.n > n);
    return this.body(n);
  };

  reached(n: number): Promise<void> {
    if (this.calls >= n) return Promise.resolve();
    return new Promise<void>((resolve) => this.waiters.push({ n, resolve }));
  }
}

function wakeSource(): { subscribe: (wake: () => void) => () => void; wake: () => void; subscribed: number; unsubscribed: number } {
  const listeners = new Set<() => void>();
  const src = {
    subscribed: 0,
    unsubscribed: 0,
    subscribe: (wake: () => void): (() => void) => {
      src.subscribed += 1;
      listeners.add(wake);
      return () => {
        src.unsubscribed += 1;
        listeners.delete(wake);
      };
    },
    wake: (): void => {
      for (const l of [...listeners]) l();
    },
  };
  return src;
}

t.test('runs steps back to back when they ask for no wait', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps((n) => {
    if (n === 5) ac.abort();
    return 0;
  });
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step });
  await t.resolves(within(done, 5_000, 'the loop to end'));
  t.equal(steps.calls, 5, 'exactly five rounds, none after the abort');
  t.strictSame(steps.events, ['step1', 'step2', 'step3', 'step4', 'step5']);
});

t.test('waits what the step asked for before the next round', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps((n) => (n === 1 ? 10 : n === 2 ? LONG : 0));
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step });
  await t.resolves(within(steps.reached(2), 5_000, 'step 2'), 'a short wait elapses and the next round runs');
  await sleep(QUIET);
  t.equal(steps.calls, 2, 'a long wait is not cut short by anything');
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'));
  t.equal(steps.calls, 2);
});

t.test('a step that returns a huge delay does not fire at once (timer overflow)', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  // Node fires a setTimeout above 2^31−1 ms after 1 ms; the loop must clamp, not spin.
  const steps = new Steps(() => 2 ** 40);
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step });
  await steps.reached(1);
  await sleep(QUIET);
  t.equal(steps.calls, 1);
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'));
});

t.test('a wake cuts a wait short', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  const steps = new Steps(() => LONG);
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe });
  await steps.reached(1);
  await sleep(QUIET);
  t.equal(steps.calls, 1, 'waiting');
  steps.events.push('wake');
  src.wake();
  await t.resolves(within(steps.reached(2), 5_000, 'step 2'), 'the wake ran the next round');
  await sleep(QUIET);
  t.equal(steps.calls, 2, 'one wake, one extra round');
  steps.events.push('wake');
  src.wake();
  await t.resolves(within(steps.reached(3), 5_000, 'step 3'), 'a second wake works too');
  t.strictSame(steps.events, ['step1', 'wake', 'step2', 'wake', 'step3']);
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'));
});

t.test('a wake during a step makes the next step run at once', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  let release: (() => void) | undefined;
  const steps = new Steps(async (n) => {
    if (n === 1) {
      // Woken mid-step (e.g. a slot file changed while renewing): wake arrives before the step returns.
      await new Promise<void>((resolve) => {
        release = resolve;
      });
    }
    return LONG;
  });
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe });
  await steps.reached(1);
  src.wake();
  await sleep(10);
  t.equal(steps.calls, 1, 'the running step is not interrupted');
  release?.();
  await t.resolves(within(steps.reached(2), 5_000, 'step 2'), 'the next round ran at once despite the long delay');
  await sleep(QUIET);
  t.equal(steps.calls, 2, 'the wake is consumed: round 2 waits its long delay');
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'));
});

t.test('a wake from inside the step itself counts too', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  const steps = new Steps((n) => {
    if (n === 1) src.wake();
    return LONG;
  });
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe });
  await t.resolves(within(steps.reached(2), 5_000, 'step 2'));
  await sleep(QUIET);
  t.equal(steps.calls, 2);
  ac.abort();
  await done;
});

t.test('a throwing step is logged and retried after errorDelayMs', async (t) => {
  const { log, records } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps((n) => {
    if (n <= 2) throw new Error(`boom ${n}`);
    return LONG;
  });
  const done = runLoop({ name: 'renew-fetch', log, signal: ac.signal, step: steps.step, errorDelayMs: 5 });
  await t.resolves(within(steps.reached(3), 5_000, 'step 3'), 'the loop survived two failed rounds');
  const errors = records.filter((r) => r.msg === 'loop step failed');
  t.equal(errors.length, 2, 'each failure logged once');
  t.match(
    errors,
    [
      { level: 50, loop: 'renew-fetch', err: { message: 'boom 1' } },
      { level: 50, loop: 'renew-fetch', err: { message: 'boom 2' } },
    ],
  );
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'));
});

t.test('after a failed step the loop waits errorDelayMs, not zero', async (t) => {
  const { log, records } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps(() => {
    throw new Error('always');
  });
  const done = runLoop({ name: 'x', log, signal: ac.signal, step: steps.step, errorDelayMs: LONG });
  await steps.reached(1);
  await sleep(QUIET);
  t.equal(steps.calls, 1, 'no retry storm');
  t.equal(records.filter((r) => r.msg === 'loop step failed').length, 1);
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'), 'abort also cuts an error wait short');
});

t.test('a step that rejects asynchronously is logged, not fatal', async (t) => {
  const { log, records } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps((n) => {
    if (n === 1) return Promise.reject(new TypeError('bad type'));
    ac.abort();
    return 0;
  });
  const done = runLoop({ name: 'x', log, signal: ac.signal, step: steps.step, errorDelayMs: 1 });
  await t.resolves(within(done, 5_000, 'the loop to end'));
  t.equal(steps.calls, 2);
  t.equal(records.filter((r) => r.msg === 'loop step failed').length, 1);
});

t.test('abort during a wait ends the loop promptly and unsubscribes the wake', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  const steps = new Steps(() => LONG);
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe });
  await steps.reached(1);
  t.equal(src.subscribed, 1);
  t.equal(src.unsubscribed, 0, 'subscribed while running');
  ac.abort();
  await t.resolves(within(done, 1_000, 'the loop to end'), 'ended well before the 60 s wait');
  t.equal(src.unsubscribed, 1, 'unsubscribed exactly once');
  src.wake();
  await sleep(10);
  t.equal(steps.calls, 1, 'no round after the abort, not even on a late wake');
});

t.test('abort during a step: the step finishes, no further round, unsubscribed', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  let release: (() => void) | undefined;
  const steps = new Steps(async () => {
    await new Promise<void>((resolve) => {
      release = resolve;
    });
    return 0;
  });
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe });
  await steps.reached(1);
  ac.abort();
  release?.();
  await t.resolves(within(done, 1_000, 'the loop to end'));
  t.equal(steps.calls, 1);
  t.equal(src.unsubscribed, 1);
});

t.test('abort from a throwing step: no error wait, loop ends, unsubscribed', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  const steps = new Steps(() => {
    ac.abort();
    throw new Error('stopping');
  });
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe, errorDelayMs: LONG });
  await t.resolves(within(done, 1_000, 'the loop to end'));
  t.equal(steps.calls, 1);
  t.equal(src.unsubscribed, 1);
});

t.test('an already aborted signal runs no step and still unsubscribes', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  ac.abort();
  const src = wakeSource();
  const steps = new Steps(() => 0);
  await runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe });
  t.equal(steps.calls, 0);
  t.equal(src.subscribed, 1);
  t.equal(src.unsubscribed, 1);
});

t.test('works without a wake source', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps((n) => {
    if (n === 3) ac.abort();
    return 1;
  });
  await t.resolves(within(runLoop({ name: 'test', log, signal: ac.signal, step: steps.step }), 5_000, 'the loop to end'));
  t.equal(steps.calls, 3);
});

t.test('a step that is done ends the loop without a wait (one-shot runs)', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  const steps = new Steps((n) => (n === 2 ? 'done' : 0));
  await t.resolves(within(runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, subscribeWake: src.subscribe }), 5_000, 'the loop to end'));
  t.equal(steps.calls, 2, 'no round after done');
  t.notOk(ac.signal.aborted, 'ended by the step, not by a stop');
  t.equal(src.unsubscribed, 1, 'unsubscribed');
});

t.test('a one-shot wait ends on abort (SIGTERM), not when the wait runs out', async (t) => {
  const { log } = memoryLogger();
  const ac = new AbortController();
  const steps = new Steps(() => LONG);
  const done = runLoop({ name: 'test', log, signal: ac.signal, step: steps.step });
  await steps.reached(1);
  ac.abort();
  await t.resolves(within(done, 5_000, 'the loop to end'));
  t.equal(steps.calls, 1);
});

t.test('failFast: a throwing step ends the loop with its error, unlogged and not retried', async (t) => {
  const { log, records } = memoryLogger();
  const ac = new AbortController();
  const src = wakeSource();
  const steps = new Steps(() => {
    throw new Error('cannot write');
  });
  await t.rejects(runLoop({ name: 'test', log, signal: ac.signal, step: steps.step, failFast: true, subscribeWake: src.subscribe }), /cannot write/);
  t.equal(steps.calls, 1, 'not retried');
  t.equal(records.filter((r) => r.msg === 'loop step failed').length, 0, 'the caller reports it, not the loop');
  t.equal(src.unsubscribed, 1, 'unsubscribed');
});
