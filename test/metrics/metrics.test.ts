import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import t from 'tap';
import { createAuditMetrics } from '../../src/metrics/audit-metrics.js';
import { createHttpMetrics } from '../../src/metrics/http-metrics.js';
import { CappedLabel, errorTypeOf, mcpMethodLabel, methodLabel, routeOf, statusLabel } from '../../src/metrics/labels.js';
import { createLinkMetrics } from '../../src/metrics/link-metrics.js';
import { registerProcessMetrics } from '../../src/metrics/process-metrics.js';
import { createApplyMetrics, createRenewalMetrics } from '../../src/metrics/renewal-metrics.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

t.test('a capped label keeps the first names, caps their length, and folds the rest into _other', async (t) => {
  const l = new CappedLabel(3, 8);
  t.equal(l.of('search'), 'search');
  t.equal(l.of('a_very_long_tool_name'), 'a_very_l', 'capped in length');
  t.equal(l.of('a_very_long_other_name'), 'a_very_l', 'the same capped name is the same series');
  t.equal(l.of('fetch'), 'fetch');
  t.equal(l.of('fourth'), '_other', 'past the cap');
  t.equal(l.of('search'), 'search', 'a name seen before keeps its series');
  t.equal(l.of('has space'), '_invalid');
  t.equal(l.of('tok=abc'), '_invalid', 'never a value with = or other punctuation');
  t.equal(new CappedLabel().of('instance:inst-1'), 'instance:inst-1', 'slot names');
});

t.test('each agent adds tool names up to its share: one agent inventing names cannot fill the table for the others', async (t) => {
  const l = new CappedLabel(8, 64, 2);
  t.equal(l.of('a1', 1000), 'a1');
  t.equal(l.of('a2', 1000), 'a2');
  t.equal(l.of('a3', 1000), '_other', 'past its share');
  t.equal(l.of('a4', 1000), '_other');
  t.equal(l.of('b1', 1001), 'b1', 'another agent still gets its names');
  t.equal(l.of('b2', 1001), 'b2');
  t.equal(l.of('a1', 1001), 'a1', 'a name already in the table is everyone\'s');
  t.equal(l.of('c1'), 'c1', 'a caller not told apart (no peer check) meets only the table\'s bound');
  const m = new CappedLabel(3, 64, 2);
  for (const uid of [1, 2, 3]) m.of(`t${uid}`, uid);
  t.equal(m.of('more', 4), '_other', 'the table\'s own bound still holds');
  // The flood through the forwarder's metrics: 40 names from one agent, then another's.
  const registry = new Registry();
  const observer = createHttpMetrics(registry, 'instances.json');
  const call = (tool: string, peerUid: number): void =>
    observer.closed({ url: '/i/x/mcp' } as never, { reqId: 'r', method: 'POST', bytesIn: 0, bytesOut: 0, outcome: 'ok', status: 200, mcpMethod: 'tools/call', tool, peerUid }, 0.01);
  for (let i = 0; i < 40; i++) call(`flood_${i}`, 1000);
  call('search', 1001);
  const text = await registry.metrics();
  t.match(text, /gen_ai_tool_name="search"/, 'the other agent\'s tool is named');
  t.equal((text.match(/mcp_server_operation_duration_seconds_count\{[^}]*gen_ai_tool_name="flood_/g) ?? []).length, 25, 'the flooder got its quarter of the table');
});

t.test('label values from fixed sets', async (t) => {
  t.equal(routeOf('/i/abcdefgh/mcp?x=1'), 'mcp');
  t.equal(routeOf('/p/notion/v1/search'), 'provider');
  t.equal(routeOf('/healthz'), 'healthz');
  t.equal(routeOf('/healthz?probe'), 'healthz');
  t.equal(routeOf('/healthzz'), 'other');
  t.equal(routeOf('http://evil/'), 'other');
  t.equal(routeOf(undefined), 'other');
  t.equal(methodLabel('POST'), 'POST');
  t.equal(methodLabel('BREW'), '_OTHER');
  t.equal(statusLabel(404), '404');
  t.equal(statusLabel(undefined), '_OTHER');
  t.equal(statusLabel(999), '_OTHER');
  t.equal(errorTypeOf('ok'), undefined);
  t.equal(errorTypeOf('health'), undefined);
  t.equal(errorTypeOf('token_unavailable'), 'token_unavailable');
  t.equal(errorTypeOf('client_closed'), 'client_closed');
  t.equal(errorTypeOf('anything else'), '_OTHER');
  t.equal(mcpMethodLabel('tools/call'), 'tools/call');
  t.equal(mcpMethodLabel('batch:tools/call'), '_OTHER');
  t.equal(mcpMethodLabel('x'.repeat(64)), '_OTHER');
});

/** Every metric name the parts register (built in-process, as each part builds its own). */
async function ourNames(): Promise<Set<string>> {
  const registry = new Registry();
  createHttpMetrics(registry, 'instances.json');
  createRenewalMetrics(registry);
  createApplyMetrics(registry);
  createLinkMetrics(registry);
  createAuditMetrics(registry);
  const names = new Set((await registry.getMetricsAsJSON()).map((m) => m.name));
  names.add('agent_connectors_build_info'); // registry.ts, which reads package.json
  return names;
}

t.test('the dashboard queries only metrics that exist', async (t) => {
  const ours = await ourNames();
  const processMetrics = new Registry();
  registerProcessMetrics(processMetrics);
  const known = new Set([...ours, ...(await processMetrics.getMetricsAsJSON()).map((m) => m.name)]);
  const dash = JSON.parse(readFileSync(resolve(ROOT, 'dashboards/agent-connectors.grafana.json'), 'utf8')) as { panels: Array<{ targets?: Array<{ expr: string }> }> };
  const exprs = dash.panels.flatMap((p) => p.targets ?? []).map((x) => x.expr);
  t.ok(exprs.length >= 20, `${exprs.length} queries`);
  const used = new Set(exprs.flatMap((e) => [...e.matchAll(/\b((?:agent_connectors|http_server|mcp_server|process|nodejs)_[a-z0-9_]+)/g)].map((m) => m[1] as string)));
  const unknown = [...used].filter((n) => !known.has(n) && !known.has(n.replace(/_(bucket|count|sum)$/, '')));
  t.same(unknown, [], 'every metric in the dashboard is one a part serves');
  for (const name of ['http_server_request_duration_seconds', 'mcp_server_operation_duration_seconds', 'agent_connectors_token_expiry_timestamp_seconds', 'agent_connectors_link_state']) {
    t.ok([...used].some((u) => u.startsWith(name)), `the dashboard shows ${name}`);
  }
});

t.test("docs/metrics.md's metric list names every metric, and no other", async (t) => {
  const ours = await ourNames();
  const doc = readFileSync(resolve(ROOT, 'docs/metrics.md'), 'utf8');
  const start = doc.indexOf('\n## The metrics\n');
  t.ok(start >= 0, 'docs/metrics.md has a section "The metrics"');
  const end = doc.indexOf('\n## ', start + 1);
  const section = doc.slice(start, end < 0 ? undefined : end);
  const listed = new Set([...section.matchAll(/^\| `([a-z_]+)`/gm)].map((m) => m[1] as string));
  t.same([...ours].filter((n) => !listed.has(n)).sort(), [], 'missing from docs/metrics.md');
  t.same([...listed].filter((n) => !ours.has(n)).sort(), [], 'listed but not served');
});
