/**
 * The real-MCP bench scenario (issue 23) as a smoke: a few SDK tool calls through every
 * peer that can run here, answers as SSE and as JSON, in a row and 8 at once. Behaviour
 * only (every call answered with the echoed text, the token injected: the server answers
 * 401 without it), never timing. mcp-remote and supergateway come from the npm registry:
 * the test never fetches, it uses the pinned copies `npm run bench -- --install-peers` put
 * in the cache, and says so when it runs without them.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { installedNpmPeers, NPM_PEERS_DIR } from '../bench/lib/npm-peers.js';
import { FRAMINGS, MCP_PEERS, PATTERNS, renderMcpMarkdown, runMcpBench } from '../bench/mcp.js';
import { CLI } from '../test/support/cli-proc.js';
import { unlessMissing } from '../test/tools/prerequisite.js';

// Eight processes start (three of them npm-installed Node programs): minutes at load 40.
t.setTimeout(900_000);

t.test('bench --mcp: SDK tool calls through every installable peer, SSE and JSON, in a row and 8 at once', async (t) => {
  const npmPeers = installedNpmPeers() !== undefined;
  if (!npmPeers) {
    const why = `mcp-remote and supergateway are not in ${NPM_PEERS_DIR} (npm run bench -- --install-peers)`;
    t.comment(`${why}: not run`);
    unlessMissing(t, why);
  }
  const expected = MCP_PEERS.filter((p) => npmPeers || (p !== 'mcp-remote' && p !== 'supergateway'));
  const dir = mkdtempSync(join(tmpdir(), 'ac-bench-mcp-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const r = await runMcpBench(
    { calls: 6, batch: 3, rounds: 1, peers: [...MCP_PEERS], install: false, docs: false, profile: false, cli: process.env.BENCH_CLI ?? CLI, out: join(dir, 'mcp.json') },
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
