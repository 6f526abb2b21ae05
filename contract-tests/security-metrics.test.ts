import t from 'tap';
import { ensureAgentUser, existingUser, runAsAgent, type AgentUser } from '../test/support/agent-user.js';
import { json } from '../test/support/mock-gateway.js';
import { binding, startRig } from '../test/support/proxy-rig.js';
import { until } from '../test/support/poll.js';
import { unlessMissing } from '../test/tools/prerequisite.js';
import { scrape } from './helpers/scrape.js';

/*
 * Issue 21 item 7: the metrics name every agent's tools and slots, so a metrics listener
 * serves only root, its own user and the users the operator names
 * (`--metrics-allowed-uids`, e.g. the Prometheus scraper's); any other local user, an
 * agent included, gets 403. And one agent inventing tool names fills only its share of
 * the tool-label table: another agent's tools keep their names. Real UIDs throughout.
 */

const isRoot = process.getuid?.() === 0;
const needs = { skip: unlessMissing(t, isRoot ? undefined : 'needs root to run clients as other users') };
const BIND = 'bind_metrics_peers_01';
const MCP_HIST = 'mcp_server_operation_duration_seconds_count';

/** `node -e` as `user`: prints what its requests got, one line each. */
async function asUser(user: AgentUser, script: string, args: string[]): Promise<string[]> {
  const r = await runAsAgent(user, 'exec "$@"', { env: { PATH: '/usr/bin:/bin' }, args: [process.execPath, '-e', script, ...args], timeoutMs: 60_000 });
  if (r.code !== 0) throw new Error(`client as ${user.name} exited ${r.code}: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean);
}

const GET_STATUS = `
fetch('http://127.0.0.1:' + process.argv[1] + '/metrics').then(async (r) => { console.log(r.status + ' ' + (await r.text()).slice(0, 40).replace(/\\n/g, ' ')); });
`;

/** `tools/call` for each name, one after the other; prints each status. */
const CALL_TOOLS = `
const [url, ...names] = process.argv.slice(1);
(async () => {
  for (const name of names) {
    const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: {} } }) });
    await r.text();
    console.log(r.status);
  }
})();
`;

t.test('metrics: root, the service user and --metrics-allowed-uids read them; an agent UID gets 403; one agent fills only its share of tool labels', needs, async (t) => {
  const flooder = ensureAgentUser();
  const other = existingUser('nobody');
  const scraper = ensureAgentUser('ac-peer-other');
  const rig = await startRig(t, 'forwarder', {
    args: ['--metrics-listen', '127.0.0.1:0', '--allowed-uids', `${flooder.uid},${other.uid}`, '--metrics-allowed-uids', scraper.name],
    tokens: { 'inst-p.token': 'tok-metrics-peers-DDDD' },
    config: (gw, dir) => ({ [BIND]: binding(dir, 'inst-p', gw.url()) }),
  });
  rig.upstream.handle((_req, res) => json(res, 200, { jsonrpc: '2.0', id: 1, result: {} }));
  const port = (await rig.proc.waitForLog((l) => l.msg === 'metrics listening', 20_000)).port as number;

  const [agentView] = await asUser(flooder, GET_STATUS, [String(port)]);
  t.match(agentView, /^403 forbidden/, 'an agent UID is refused');
  t.notMatch(agentView, /gen_ai_tool_name|mcp_server/, 'and reads no series');
  t.match((await asUser(other, GET_STATUS, [String(port)]))[0], /^403 /, 'so is any other local user');
  t.match((await asUser(scraper, GET_STATUS, [String(port)]))[0], /^200 /, 'the allowed scraper reads them');
  t.ok((await scrape(port)).text.length > 0, 'root reads them');

  // 40 invented names from one agent, then one real tool of another.
  const url = `${rig.proc.base}/i/${BIND}/mcp`;
  const flood = Array.from({ length: 40 }, (_v, i) => `invented_${i}`);
  t.ok((await asUser(flooder, CALL_TOOLS, [url, ...flood])).every((s) => s === '200'), 'the flooder\'s calls are served');
  t.same(await asUser(other, CALL_TOOLS, [url, 'search_docs']), ['200'], 'the other agent\'s call');
  await until(() => rig.proc.logs.filter((l) => l.msg === 'access').length >= 41, '41 access lines');
  const s = await scrape(port);
  const tools = s.find(MCP_HIST, { mcp_method_name: 'tools/call' }).map((x) => x.labels.gen_ai_tool_name ?? '');
  t.ok(tools.includes('search_docs'), 'the other agent\'s tool keeps its name');
  t.equal(tools.filter((n) => n.startsWith('invented_')).length, 25, 'the flooder got its share (a quarter of 100)');
  t.equal(s.value(MCP_HIST, { mcp_method_name: 'tools/call', gen_ai_tool_name: '_other', error_type: '' }), 15, 'its other names went to _other');
});
