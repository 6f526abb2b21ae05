/**
 * The benchmark's smoke mode as a regression guard (issue 6): the harness runs end to end
 * against the built forwarder, and streaming stays ordered, unbuffered and flat in memory.
 * Behaviour only, never timing: a slow or busy machine passes, a buffering proxy fails.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { FRAMINGS, MCP_PEERS, PATTERNS, renderMcpMarkdown, runMcpBench } from '../bench/mcp.js';
import { installedNpmPeers, NPM_PEERS_DIR } from '../bench/lib/npm-peers.js';
import { runSmoke } from '../bench/smoke.js';
import { CLI } from '../test/support/cli-proc.js';

t.test('bench --smoke: forwarder streams in order, unbuffered, with exact bytes and flat RSS', async (t) => {
  const result = await runSmoke({ cli: process.env.BENCH_CLI ?? CLI, log: (line) => t.comment(line) });
  t.comment(`figures (not asserted): ${JSON.stringify(result.figures)}`);
  for (const c of result.checks) t.ok(c.ok, `${c.name}: ${c.detail}`);
  t.ok(result.checks.length >= 9, 'every check ran');
});

/**
 * The real-MCP scenario (issue 23): a few SDK tool calls through every peer that can run
 * here. mcp-remote and supergateway come from the npm registry; the test never fetches,
 * it uses the pinned copies when `npm run bench -- --install-peers` has put them in the
 * cache (.ci/run does), and says so when it skips them.
 */
t.test('bench --mcp: SDK tool calls through every installable peer, SSE and JSON, in a row and 8 at once', async (t) => {
  const npmPeers = installedNpmPeers() !== undefined;
  if (!npmPeers) t.comment(`mcp-remote and supergateway are not in ${NPM_PEERS_DIR} (npm run bench -- --install-peers): not run`);
  const expected = MCP_PEERS.filter((p) => npmPeers || (p !== 'mcp-remote' && p !== 'supergateway'));
  const dir = mkdtempSync(join(tmpdir(), 'ac-bench-mcp-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const r = await runMcpBench(
    { calls: 6, batch: 3, rounds: 1, peers: [...MCP_PEERS], install: false, docs: false, cli: process.env.BENCH_CLI ?? CLI, out: join(dir, 'mcp.json') },
    (line) => t.comment(line),
  );
  t.same(r.peers, expected, 'every installable peer ran');
  for (const framing of FRAMINGS) {
    for (const pattern of Object.keys(PATTERNS)) {
      for (const peer of expected) {
        const cell = r.rounds[0]?.[`${framing} ${pattern}`]?.[peer];
        t.equal(cell?.calls, 6, `${peer}, ${framing} answers, ${pattern}: every call answered with the echoed text`);
        if (peer !== 'direct') t.ok(Number.isFinite(cell?.cpuUsPerCall), `${peer}: its CPU was read from /proc`);
      }
    }
  }
  const table = renderMcpMarkdown(r);
  for (const peer of expected) t.match(table, new RegExp(`\\| ${peer} \\|`), `the table has ${peer}`);
  t.ok(JSON.parse(readFileSync(join(dir, 'mcp.json'), 'utf8')).rows.length >= expected.length * 4, 'the JSON holds every row');
});
