import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { inboxBatchSchema, inboxFileSchema, isBatchFileName, MAX_BATCH_ENTRIES, type InboxFile } from '../../../src/data/handoff.js';
import { InboxBatcher } from '../../../src/link/renewal/inbox-batcher.js';
import { tempDir } from '../../support/temp-dir.js';

const NOW = Date.UTC(2030, 0, 1, 12, 0, 0);

function answer(i: number, token = `gw_secret-${i}`): InboxFile {
  return { slot: `instance:inst-${i}`, tokenId: `tok_${i}`, token, expiresAt: '2030-01-01T13:00:00.000Z', credentialGeneration: 1 };
}

/** The batch files of `dir` in name order, each as its entries (checked as apply checks them). */
function batches(dir: string): InboxFile[][] {
  // A dot file is the next batch's temp, being written.
  const names = readdirSync(dir).filter((n) => !n.startsWith('.')).sort();
  for (const n of names) if (!isBatchFileName(n)) throw new Error(`not a batch file: ${n}`);
  return names.map((n) => inboxBatchSchema.parse(JSON.parse(readFileSync(join(dir, n), 'utf8'))).entries.map((e) => inboxFileSchema.parse(e)));
}

t.test('a lone answer is written at once, alone, 0640; answers arriving during that write share the next file', async (t) => {
  const dir = join(tempDir('ac-batcher-', t), 'inbox');
  mkdirSync(dir);
  const b = new InboxBatcher({ dir, now: () => NOW });
  const first = b.deliver(answer(0));
  // Delivered while the first file's write (its fsyncs) is in flight: no timer, they wait for it.
  const rest = Array.from({ length: 10 }, (_, i) => b.deliver(answer(i + 1)));
  await first;
  t.strictSame(batches(dir).map((x) => x.map((e) => e.slot)), [['instance:inst-0']], 'the first answer durable on its own');
  await Promise.all(rest);
  const files = batches(dir);
  t.equal(files.length, 2, 'two files for eleven answers');
  t.strictSame(files[1]?.map((e) => e.slot), Array.from({ length: 10 }, (_, i) => `instance:inst-${i + 1}`), 'the ten in arrival order, in the second file');
  t.strictSame(files[1]?.[3], answer(4), 'entries exactly as delivered');
  for (const n of readdirSync(dir)) t.equal(statSync(join(dir, n)).mode & 0o777, 0o640, `${n} is 0640`);
  t.notOk(readdirSync(dir).some((n) => n.startsWith('.')), 'no temp file left once every answer is delivered');
});

t.test('names sort in write order, also with a clock that does not move', async (t) => {
  const dir = join(tempDir('ac-batcher-', t), 'inbox');
  mkdirSync(dir);
  const b = new InboxBatcher({ dir, now: () => NOW });
  for (let i = 0; i < 5; i++) await b.deliver(answer(i));
  t.strictSame(batches(dir).map((x) => x[0]?.slot), [0, 1, 2, 3, 4].map((i) => `instance:inst-${i}`));
  // A second batcher (a restarted link) with a later clock sorts after.
  const later = new InboxBatcher({ dir, now: () => NOW + 1 });
  await later.deliver(answer(9));
  t.equal(batches(dir).at(-1)?.[0]?.slot, 'instance:inst-9', "the restarted link's file sorts last");
});

t.test('the entry bound splits a group', async (t) => {
  const dir = join(tempDir('ac-batcher-', t), 'inbox');
  mkdirSync(dir);
  const b = new InboxBatcher({ dir });
  const first = b.deliver(answer(0));
  const many = Array.from({ length: MAX_BATCH_ENTRIES + 20 }, (_, i) => b.deliver(answer(i + 1)));
  await Promise.all([first, ...many]);
  t.strictSame(batches(dir).map((x) => x.length), [1, MAX_BATCH_ENTRIES, 20]);
});

t.test('the byte bound splits a group of large answers', async (t) => {
  const dir = join(tempDir('ac-batcher-', t), 'inbox');
  mkdirSync(dir);
  const b = new InboxBatcher({ dir });
  const big = 'x'.repeat(15 * 1024); // tokens are at most 16 KiB
  const first = b.deliver(answer(0));
  const rest = Array.from({ length: 400 }, (_, i) => b.deliver(answer(i + 1, big)));
  await Promise.all([first, ...rest]);
  const files = batches(dir);
  t.ok(files.length > 2, `split into ${files.length} files`);
  t.equal(files.flat().length, 401, 'every answer in one of them');
  for (const n of readdirSync(dir)) t.ok(statSync(join(dir, n)).size <= 4 * 1024 * 1024, `${n} within apply's bound`);
});

t.test("a failed write rejects every answer of its file; the next write works again", async (t) => {
  const root = tempDir('ac-batcher-', t);
  const dir = join(root, 'inbox');
  writeFileSync(dir, 'not a directory');
  const b = new InboxBatcher({ dir });
  const results = await Promise.allSettled([b.deliver(answer(0)), b.deliver(answer(1)), b.deliver(answer(2))]);
  t.strictSame(results.map((r) => r.status), ['rejected', 'rejected', 'rejected'], 'each renewal learns its answer was not handed over');
  for (const r of results) if (r.status === 'rejected') t.notMatch(String(r.reason), /gw_secret/, 'no token in the error');
  rmSync(dir);
  mkdirSync(dir);
  await b.deliver(answer(3));
  t.strictSame(batches(dir).map((x) => x.map((e) => e.slot)), [['instance:inst-3']]);
});

t.test('an inbox removed meanwhile is made again', async (t) => {
  const dir = join(tempDir('ac-batcher-', t), 'inbox');
  const b = new InboxBatcher({ dir });
  await b.deliver({ slot: 'cli:notion', revoked: true, at: '2030-01-01T12:00:00.000Z' });
  t.strictSame(batches(dir), [[{ slot: 'cli:notion', revoked: true, at: '2030-01-01T12:00:00.000Z' }]]);
});
