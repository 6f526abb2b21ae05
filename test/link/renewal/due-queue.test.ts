import t from 'tap';
import { DueQueue } from '../../../src/link/renewal/due-queue.js';

t.test('DueQueue: soonest first, ties in scheduling order, only what is due', async (t) => {
  const q = new DueQueue();
  q.schedule('c', 30);
  q.schedule('a', 0);
  q.schedule('b', 0);
  q.schedule('d', 10);
  t.equal(q.size, 4);
  t.equal(q.peekDue(), 0);
  t.equal(q.popDue(5), 'a');
  t.equal(q.popDue(5), 'b', 'a tie goes in the order it was scheduled');
  t.equal(q.popDue(5), undefined, 'd is not due at 5');
  t.equal(q.peekDue(), 10);
  t.equal(q.popDue(100), 'd');
  t.equal(q.popDue(100), 'c');
  t.equal(q.popDue(100), undefined);
  t.equal(q.size, 0);
});

t.test('DueQueue: a slot rescheduled or removed leaves no second entry behind', async (t) => {
  const q = new DueQueue();
  q.schedule('a', 50);
  q.schedule('b', 20);
  q.schedule('a', 10);
  t.equal(q.size, 2, 'a slot has one live entry');
  q.remove('b');
  t.notOk(q.has('b'));
  t.equal(q.popDue(100), 'a');
  t.equal(q.popDue(100), undefined, "neither a's old time nor the removed b comes back");
  t.equal(q.peekDue(), undefined);
});

t.test('DueQueue: many reschedules compact the heap and keep the order', async (t) => {
  const q = new DueQueue();
  const n = 1_000;
  for (let round = 0; round < 20; round++) for (let i = 0; i < n; i++) q.schedule(`s${i}`, (i * 7919 + round) % n);
  t.equal(q.size, n);
  const out: string[] = [];
  let last = -Infinity;
  let ordered = true;
  for (let id = q.popDue(Infinity); id !== undefined; id = q.popDue(Infinity)) {
    const due = (Number(id.slice(1)) * 7919 + 19) % n;
    if (due < last) ordered = false;
    last = due;
    out.push(id);
  }
  t.equal(out.length, n, 'every slot once, at its last time');
  t.ok(ordered, 'in due order');
});
