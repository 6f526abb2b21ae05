import t from 'tap';
import { requestId } from '../../src/http/request-id.js';

t.test('request ids are version 4 UUIDs, lower-case, as crypto.randomUUID writes them, and unique', async (t) => {
  const seen = new Set<string>();
  let bad = 0;
  // Over several refills of the pool (128 ids each).
  for (let i = 0; i < 1000; i++) {
    const id = requestId();
    if (!/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(id)) bad++;
    seen.add(id);
  }
  t.equal(bad, 0, 'the UUID form, version 4, variant 10');
  t.equal(seen.size, 1000, 'no id repeats');
});

t.test('each hex digit of the random part takes every value', async (t) => {
  const counts = Array.from({ length: 36 }, () => new Set<string>());
  for (let i = 0; i < 2000; i++) [...requestId()].forEach((c, k) => counts[k]?.add(c));
  const sizes = counts.map((s) => s.size);
  t.strictSame(
    sizes.map((n, k) => ([8, 13, 18, 23].includes(k) ? n === 1 : k === 14 ? n === 1 : k === 19 ? n === 4 : n === 16)),
    sizes.map(() => true),
    'dashes fixed, the version digit 4, the variant digit one of 8 9 a b, all others 16 values',
  );
});
