/**
 * The benchmark's smoke mode as a regression guard (issue 6): the harness runs end to end
 * against the built forwarder, and streaming stays ordered, unbuffered and flat in memory.
 * Behaviour only, never timing: a slow or busy machine passes, a buffering proxy fails.
 */
import t from 'tap';
import { runSmoke } from '../bench/smoke.js';
import { CLI } from '../test/support/cli-proc.js';

t.test('bench --smoke: forwarder streams in order, unbuffered, with exact bytes and flat RSS', async (t) => {
  const result = await runSmoke({ cli: process.env.BENCH_CLI ?? CLI, log: (line) => t.comment(line) });
  t.comment(`figures (not asserted): ${JSON.stringify(result.figures)}`);
  for (const c of result.checks) t.ok(c.ok, `${c.name}: ${c.detail}`);
  t.ok(result.checks.length >= 9, 'every check ran');
});
