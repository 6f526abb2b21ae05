import t from 'tap';
import { eachBounded } from '../../../src/link/renewal/bounded-each.js';

/** A call per item that stays open until the test lets it go. */
function gatedCalls(): { open: Map<number, () => void>; max: () => number; fn: (n: number) => Promise<undefined> } {
  const open = new Map<number, () => void>();
  let max = 0;
  return {
    open,
    max: () => max,
    fn: (n) =>
      new Promise((resolve) => {
        open.set(n, () => {
          open.delete(n);
          resolve(undefined);
        });
        max = Math.max(max, open.size);
      }),
  };
}

async function settle(): Promise<void> {
  await new Promise((r) => setImmediate(r));
}

t.test('never more than the bound in flight; every item exactly once', async (t) => {
  const calls = gatedCalls();
  const seen: number[] = [];
  const done = eachBounded(Array.from({ length: 20 }, (_v, i) => i), 3, (n) => {
    seen.push(n);
    return calls.fn(n);
  });
  while (seen.length < 20 || calls.open.size > 0) {
    await settle();
    t.ok(calls.open.size <= 3, `at most 3 open (${calls.open.size})`);
    // Finish the oldest open call: the pool must start the next item in its place.
    const first = [...calls.open.values()][0];
    first?.();
  }
  await done;
  t.equal(calls.max(), 3, 'the bound is reached');
  t.same(seen, Array.from({ length: 20 }, (_v, i) => i), 'each item once, started in order');
});

t.test("'stop' and a throw start nothing more; calls in flight finish before it returns", async (t) => {
  const started: number[] = [];
  let finished = 0;
  await eachBounded([1, 2, 3, 4, 5, 6], 2, async (n) => {
    started.push(n);
    await settle();
    finished += 1;
    return n === 2 ? 'stop' : undefined;
  });
  t.same(started, [1, 2, 3], 'item 3 had started when 2 said stop; nothing after');
  t.equal(finished, 3);

  const boom = new Error('boom');
  let running = 0;
  await t.rejects(
    eachBounded([1, 2, 3, 4], 2, async (n) => {
      running += 1;
      await settle();
      running -= 1;
      if (n === 1) throw boom;
      return undefined;
    }),
    boom,
  );
  t.equal(running, 0, 'no call left running behind the rejection');
});
