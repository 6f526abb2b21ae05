import { readdirSync, readFileSync, readlinkSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import t from 'tap';
import { checkNoLeaks, knownSecrets, leakedSecrets, startCli, writeToken, type CliProc } from '../test/support/cli-proc.js';
import { json, MockGateway, sse } from '../test/support/mock-gateway.js';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { scrape, type Labels } from './helpers/scrape.js';
import { until } from '../test/support/poll.js';
import { binding, loadConfig, startProxy, startRig } from '../test/support/proxy-rig.js';
import { tempDir } from '../test/support/temp-dir.js';
import { makeRig } from './helpers/renew-harness.js';
import { assertJsonError, send } from './helpers/http-raw.js';
import { StreamReader } from './helpers/sse-client.js';

/**
 * SPEC §9 metrics, black-box: each part started with `--metrics-listen` is driven through
 * a scripted scenario against real processes, then scraped; every counter and histogram
 * must hold exactly the counts the scenario produced (not "at least one").
 */

async function metricsPort(proc: CliProc): Promise<number> {
  const line = await proc.waitForLog((l) => l.msg === 'metrics listening', 20_000);
  return line.port as number;
}

/** Waits until the process has written `n` access lines: each is written right before its request's metrics. */
async function accessLines(proc: CliProc, n: number): Promise<void> {
  await until(() => proc.logs.filter((l) => l.msg === 'access').length >= n, `${n} access lines`);
}

const rpc = (method: string, tool?: string): string =>
  JSON.stringify({ jsonrpc: '2.0', id: 1, method, ...(tool ? { params: { name: tool, arguments: { q: 'secret-argument-value' } } } : {}) });
const OK = '{"jsonrpc":"2.0","id":1,"result":{}}';
const MCP_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
const HIST = 'http_server_request_duration_seconds_count';
const MCP_HIST = 'mcp_server_operation_duration_seconds_count';

t.test('forwarder: a scripted scenario gives exactly its counts', async (t) => {
  const A = 'bind_metrics_ok_0001';
  const B = 'bind_metrics_notoken_1';
  let accepted = 'tok-metrics-0-AAAA';
  let stream: ReturnType<typeof sse> | undefined;
  const rig = await startRig(t, 'forwarder', {
    args: ['--metrics-listen', '127.0.0.1:0'],
    tokens: { 'inst-a.token': accepted },
    config: (gw, dir) => ({ [A]: binding(dir, 'inst-a', gw.url()) }),
  });
  const { upstream: gw, proc: fwd } = rig;
  const port = await metricsPort(fwd);
  gw.handle((req, res) => {
    if (req.headers.authorization !== `Bearer ${accepted}`) return json(res, 401, { error: 'invalid_token' });
    if (req.body.toString().includes('"count"')) {
      stream = sse(res);
      stream.send('data: {"step":1}\n\n');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(OK) });
    res.end(OK);
  });
  const url = `${fwd.base}/i/${A}/mcp`;
  let lines = 0;

  // 1. JSON: initialize, then two calls of one tool.
  for (const body of [rpc('initialize'), rpc('tools/call', 'search'), rpc('tools/call', 'search')]) {
    t.equal((await send(url, { headers: MCP_HEADERS, body })).status, 200);
  }
  lines += 3;
  // 2. SSE: open while the test holds it, closed once the upstream ends it.
  const res = await request(url, { method: 'POST', headers: MCP_HEADERS, body: rpc('tools/call', 'count') });
  const reader = new StreamReader(res.body);
  await reader.waitForText('"step":1');
  let s = await scrape(port);
  t.equal(s.value('agent_connectors_open_streams', { http_route: 'mcp' }), 1, 'one stream open');
  stream?.end();
  t.same(await reader.ended, { kind: 'end' });
  lines += 1;
  await accessLines(fwd, lines);
  s = await scrape(port);
  t.equal(s.value('agent_connectors_open_streams', { http_route: 'mcp' }), 0, 'and closed');

  // 3. A reload that adds a binding whose token file is missing, then a call to it.
  await loadConfig(fwd, { [A]: binding(fwd.dir, 'inst-a', gw.url()), [B]: binding(fwd.dir, 'inst-missing', gw.url()) });
  assertJsonError(t, await send(`${fwd.base}/i/${B}/mcp`, { headers: MCP_HEADERS, body: rpc('tools/call', 'search') }), 503, 'token_unavailable');
  lines += 1;
  // 4. A rejected reload: the last good registry stays.
  const mark = fwd.logs.length;
  writeFileSync(`${fwd.configPath}.tmp`, '{ not json');
  renameSync(`${fwd.configPath}.tmp`, fwd.configPath);
  await fwd.waitForLog((l) => l.msg === 'registry rejected; keeping last good', 10_000, mark);
  s = await scrape(port);
  t.equal(s.value('agent_connectors_config_last_reload_successful', { file: 'instances.json' }), 0, 'the rejected load shows');
  await loadConfig(fwd, { [A]: binding(fwd.dir, 'inst-a', gw.url()), [B]: binding(fwd.dir, 'inst-missing', gw.url()) });

  // 5. A 401 met during a rotation, retried once with the renewed token.
  accepted = 'tok-metrics-1-BBBB';
  knownSecrets.add(accepted);
  const seen = gw.requests.length;
  const pending = send(url, { headers: MCP_HEADERS, body: rpc('tools/call', 'search') });
  await gw.waitForRequests(seen + 1);
  writeToken(join(fwd.dir, 'inst-a.token.new'), accepted);
  renameSync(join(fwd.dir, 'inst-a.token.new'), join(fwd.dir, 'inst-a.token'));
  t.equal((await pending).status, 200);
  lines += 1;
  // 6. Health and an unknown route.
  t.equal((await send(`${fwd.base}/healthz`, { method: 'GET' })).status, 200);
  assertJsonError(t, await send(`${fwd.base}/nowhere?x=1`, { method: 'GET' }), 404, 'not_found');
  lines += 2;

  await accessLines(fwd, lines);
  s = await scrape(port);
  const mcp = (status: string, error_type = ''): Labels => ({ http_route: 'mcp', http_request_method: 'POST', http_response_status_code: status, error_type });
  t.equal(s.value(HIST, mcp('200')), 5, 'five POSTs answered 200 (three JSON, one SSE, one retried)');
  t.equal(s.value(HIST, mcp('503', 'token_unavailable')), 1);
  t.equal(s.value(HIST, { http_route: 'healthz', http_request_method: 'GET', http_response_status_code: '200', error_type: '' }), 1);
  t.equal(s.value(HIST, { http_route: 'other', http_request_method: 'GET', http_response_status_code: '404', error_type: 'not_found' }), 1);
  t.equal(s.find(HIST).reduce((n, x) => n + x.value, 0), 8, 'eight requests in all');
  t.equal(s.value(MCP_HIST, { mcp_method_name: 'initialize', gen_ai_tool_name: '', error_type: '' }), 1);
  t.equal(s.value(MCP_HIST, { mcp_method_name: 'tools/call', gen_ai_tool_name: 'search', error_type: '' }), 3);
  t.equal(s.value(MCP_HIST, { mcp_method_name: 'tools/call', gen_ai_tool_name: 'count', error_type: '' }), 1);
  t.equal(s.value(MCP_HIST, { mcp_method_name: 'tools/call', gen_ai_tool_name: 'search', error_type: 'token_unavailable' }), 1);
  t.equal(s.value('agent_connectors_token_read_failures_total', { reason: 'missing' }), 1);
  t.equal(s.value('agent_connectors_token_read_failures_total', { reason: 'malformed' }), 0);
  t.equal(s.value('agent_connectors_upstream_unauthorized_total', { result: 'retried' }), 1);
  t.equal(s.value('agent_connectors_upstream_unauthorized_total', { result: 'no_renewed_token' }), 0);
  // Loads: the start, the binding added, the good file after the bad one, and the bad one.
  // A busy machine may deliver one rename as two watch events (two loads of one file): the
  // count must be the log's, whatever it is.
  const loads = fwd.logs.filter((l) => l.msg === 'registry loaded').length;
  const rejected = fwd.logs.filter((l) => l.msg === 'registry rejected; keeping last good').length;
  t.ok(loads >= 3 && rejected >= 1, `${loads} loads, ${rejected} rejected`);
  t.equal(s.value('agent_connectors_config_reloads_total', { file: 'instances.json', result: 'ok' }), loads);
  t.equal(s.value('agent_connectors_config_reloads_total', { file: 'instances.json', result: 'rejected' }), rejected);
  t.equal(s.value('agent_connectors_config_last_reload_successful', { file: 'instances.json' }), 1);
  t.equal(s.value('agent_connectors_config_entries', { file: 'instances.json' }), 2);
  const sent = [rpc('initialize'), ...Array<string>(4).fill(rpc('tools/call', 'search')), rpc('tools/call', 'count')].reduce((n, b) => n + Buffer.byteLength(b), 0);
  t.equal(s.value('agent_connectors_request_body_bytes_total', { http_route: 'mcp' }), sent, 'request bytes: what the agent sent, the retried request once');
  t.ok(s.value('agent_connectors_response_body_bytes_total', { http_route: 'mcp' }) > 0);
  t.equal(s.value('agent_connectors_build_info', { version: s.find('agent_connectors_build_info')[0]?.labels.version ?? '' }), 1);
  t.ok(s.find(HIST).every((x) => x.labels.part === 'forwarder'), 'every series names its part');
  t.notMatch(s.text, /secret-argument-value|nowhere|x=1|bind_metrics/, 'no argument, path, query or binding id in any label');
  t.same(leakedSecrets(s.text), [], 'no token in the scrape');
});

t.test('a flood of distinct tool names stays within the cap', async (t) => {
  const BIND = 'bind_metrics_flood_01';
  const rig = await startRig(t, 'forwarder', {
    args: ['--metrics-listen', '127.0.0.1:0'],
    tokens: { 'inst-f.token': 'tok-metrics-flood-CCCC' },
    config: (gw, dir) => ({ [BIND]: binding(dir, 'inst-f', gw.url()) }),
  });
  const port = await metricsPort(rig.proc);
  rig.upstream.handle((_req, res) => json(res, 200, { jsonrpc: '2.0', id: 1, result: {} }));
  const url = `${rig.proc.base}/i/${BIND}/mcp`;
  const NAMES = 160;
  const names = Array.from({ length: NAMES }, (_v, i) => `tool_${i}_${'x'.repeat(i % 3 === 0 ? 100 : 5)}`);
  // 8 agents at once, with the name in Mcp-Name (as the 2025-11 transport sends it) for half.
  const queue = [...names];
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
        const headers: Record<string, string> = name.length % 2 === 0 ? { ...MCP_HEADERS, 'mcp-method': 'tools/call', 'mcp-name': name } : MCP_HEADERS;
        t.equal((await send(url, { headers, body: rpc('tools/call', name) })).status, 200);
      }
    }),
  );
  await accessLines(rig.proc, NAMES);
  const s = await scrape(port);
  const series = s.find(MCP_HIST, { mcp_method_name: 'tools/call' });
  const tools = new Set(series.map((x) => x.labels.gen_ai_tool_name));
  t.equal(tools.size, 101, '100 names and _other');
  t.ok(tools.has('_other'));
  t.ok([...tools].every((n) => (n ?? '').length <= 64), 'every name capped at 64 characters');
  t.equal(series.reduce((n, x) => n + x.value, 0), NAMES, 'every call counted');
  t.equal(s.value(MCP_HIST, { mcp_method_name: 'tools/call', gen_ai_tool_name: '_other', error_type: '' }), NAMES - 100);
});

t.test('--metrics-listen refuses a non-loopback address and the part\'s own port (exit 2)', async (t) => {
  const state = tempDir('ac-metrics-refuse-', t);
  for (const [part, address] of [
    ['forwarder', '0.0.0.0:9464'],
    ['cli-proxy', '192.0.2.1:9464'],
    ['forwarder', '[::]:9464'],
    ['renew apply', 'example.com:9464'],
  ] as const) {
    const proc = startCli([...part.split(' '), '--state-dir', state, '--metrics-listen', address, ...(part === 'renew apply' ? ['--watch'] : [])]);
    const exit = await proc.exited;
    t.equal(exit.code, 2, `${part} --metrics-listen ${address}`);
    t.match(proc.stderr.join('\n'), /--metrics-listen must be a loopback address/);
  }
  const same = startCli(['forwarder', '--state-dir', state, '--listen', '127.0.0.1:14399', '--metrics-listen', '127.0.0.1:14399']);
  t.equal((await same.exited).code, 2);
  t.match(same.stderr.join('\n'), /must not be the part's own port/);
});

/** The TCP ports process `pid` listens on (its sockets in /proc/net/tcp{,6} in state LISTEN). */
function listeningPorts(pid: number): number[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m?.[1]) inodes.add(m[1]);
    } catch {
      // closed meanwhile
    }
  }
  const ports: number[] = [];
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    for (const line of readFileSync(table, 'utf8').split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f[3] === '0A' && f[9] && inodes.has(f[9])) ports.push(parseInt((f[1] ?? '').split(':')[1] ?? '', 16));
    }
  }
  return ports;
}

t.test('metrics are off by default: the part listens on its own port only', async (t) => {
  const fwd = await startProxy(t, 'forwarder');
  t.same(listeningPorts(fwd.child.pid ?? 0), [fwd.port]);
  t.notOk(fwd.logs.some((l) => l.msg === 'metrics listening'));
  const on = await startProxy(t, 'forwarder', { args: ['--metrics-listen', '127.0.0.1:0'] });
  const port = await metricsPort(on);
  t.same(listeningPorts(on.child.pid ?? 0).sort(), [on.port, port].sort(), 'with the option, one port more');
  const wrongHost = await request(`http://127.0.0.1:${port}/metrics`, { headers: { host: 'evil.example:80' } });
  await wrongHost.body.dump();
  t.equal(wrongHost.statusCode, 403, 'a rebound Host is refused');
});

t.test('cli-proxy: requests by route, a missing token', async (t) => {
  const rig = await startRig<MockGateway>(t, 'cli-proxy', {
    args: ['--metrics-listen', '127.0.0.1:0'],
    tokens: { 'acme.token': 'tok-metrics-cli-DDDD' },
    config: (gw, dir) => ({
      acme: { upstream: gw.url(), tokenFile: join(dir, 'acme.token'), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: 'acme', env: {} }] },
      gone: { upstream: gw.url(), tokenFile: join(dir, 'gone.token'), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: 'gone', env: {} }] },
    }),
  });
  rig.upstream.handle((_req, res) => json(res, 200, { ok: true }));
  const port = await metricsPort(rig.proc);
  t.equal((await send(`${rig.proc.base}/p/acme/v1/items?secret-query=1`, { method: 'GET' })).status, 200);
  t.equal((await send(`${rig.proc.base}/p/acme/v1/items`, { body: '{"a":1}' })).status, 200);
  assertJsonError(t, await send(`${rig.proc.base}/p/gone/v1/items`, { method: 'GET' }), 503, 'token_unavailable');
  await accessLines(rig.proc, 3);
  const s = await scrape(port);
  const p = (method: string, status: string, error_type = ''): Labels => ({ http_route: 'provider', http_request_method: method, http_response_status_code: status, error_type });
  t.equal(s.value(HIST, p('GET', '200')), 1);
  t.equal(s.value(HIST, p('POST', '200')), 1);
  t.equal(s.value(HIST, p('GET', '503', 'token_unavailable')), 1);
  t.equal(s.value('agent_connectors_token_read_failures_total', { reason: 'missing' }), 1);
  t.equal(s.value('agent_connectors_request_body_bytes_total', { http_route: 'provider' }), 7);
  t.equal(s.value('agent_connectors_config_entries', { file: 'providers.json' }), 2);
  t.equal(s.find(MCP_HIST).length, 0, 'no MCP series on the cli-proxy');
  t.notMatch(s.text, /secret-query|v1\/items|acme/, 'no path, query or provider name in any label');
});

t.test('link and apply: renewal iterations, failures, durations, slot expiry, tokens applied', async (t) => {
  const rig = await makeRig(t);
  const SLOT = 'instance:inst-metrics';
  rig.addSlot(SLOT);
  rig.gw.inject({ kind: 'status5xx', status: 503 });
  const fetch = rig.startFetch(['--metrics-listen', '127.0.0.1:0', '--backoff-cap-ms', '200']);
  const fetchPort = await metricsPort(fetch);
  await fetch.waitForLog((l) => l.msg === 'renewed; handed to apply', 20_000);
  const apply = startCli(['renew', 'apply', '--watch', '--handoff', rig.handoff, '--state-dir', rig.applyState, '--metrics-listen', '127.0.0.1:0', '--log-level', 'trace']);
  t.teardown(async () => {
    await apply.stop('SIGKILL');
  });
  const applyPort = await metricsPort(apply);
  await apply.waitForLog((l) => l.msg === 'inbox processed' && l.applied === 1, 20_000);
  rig.harvest();
  const expiresAt = rig.readSlot(SLOT).expiresAt;
  t.ok(expiresAt, 'apply wrote the slot file');
  // fetch watches slots/: the expiry of the token in force follows the slot file.
  let s = await scrape(fetchPort);
  await until(async () => {
    s = await scrape(fetchPort);
    return s.value('agent_connectors_token_expiry_timestamp_seconds', { slot: SLOT }) > 0;
  }, 'the slot expiry gauge');
  t.equal(s.value('agent_connectors_token_expiry_timestamp_seconds', { slot: SLOT }), Date.parse(expiresAt ?? '') / 1000);
  t.equal(s.value('agent_connectors_renewal_iterations_total', { result: 'retry' }), 1, 'the 503');
  t.equal(s.value('agent_connectors_renewal_iterations_total', { result: 'renewed' }), 1);
  t.equal(s.value('agent_connectors_renewal_iterations_total', { result: 'credential_invalid' }), 0);
  t.equal(s.value('agent_connectors_renewal_failures_total', { result: 'retry' }), 1);
  t.equal(s.value('agent_connectors_renewal_duration_seconds_count'), 2);
  t.ok(s.find('agent_connectors_renewal_duration_seconds_count').every((x) => x.labels.part === 'link'));
  const a = await scrape(applyPort);
  t.equal(a.value('agent_connectors_apply_tokens_total', { result: 'applied' }), 1);
  t.equal(a.value('agent_connectors_apply_tokens_total', { result: 'rejected' }), 0);
  t.same(leakedSecrets(s.text + a.text), [], 'no token or credential in either scrape');
});

t.test('link: state, polls by result, last sync', async (t) => {
  const HOST = 'host-metrics-1';
  const credential = 'hostcred-metrics-5e2b7a91c0d4';
  knownSecrets.add(credential);
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { [HOST]: credential } });
  t.teardown(() => gw.close());
  const dir = tempDir('ac-metrics-link-', t);
  const handoff = join(dir, 'handoff');
  const credentialPath = join(dir, 'host-credential');
  writeToken(credentialPath, credential);
  const link = startCli(
    ['link', '--gateway', gw.url, '--credential', credentialPath, '--handoff', handoff, '--state-dir', join(dir, 'state'), '--host-id', HOST]
      .concat(['--link-backoff-base-ms', '200', '--link-backoff-cap-ms', '400', '--poll-timeout-ms', '1500', '--metrics-listen', '127.0.0.1:0'])
      .concat(['--forwarder-health', 'http://127.0.0.1:9/healthz', '--cli-proxy-health', 'http://127.0.0.1:9/healthz', '--log-level', 'debug']),
  );
  t.teardown(() => link.stop('SIGKILL'));
  const port = await metricsPort(link);
  await link.waitForLog((l) => l.msg === 'desired state handed over to apply', 20_000);
  let s = await scrape(port);
  await until(async () => (s = await scrape(port)).value('agent_connectors_link_state', { state: 'synced' }) === 1, 'synced');
  const FAULTS = 12;
  gw.inject({ kind: 'status5xx', status: 503 }, { endpoint: 'state', times: FAULTS });
  await until(async () => (s = await scrape(port)).value('agent_connectors_link_state', { state: 'retrying' }) === 1, 'retrying while the Gateway fails');
  t.equal(s.find('agent_connectors_link_state').reduce((n, x) => n + x.value, 0), 1, 'one state at a time');
  const failedAt = s.value('agent_connectors_link_last_sync_timestamp_seconds');
  t.ok(failedAt > 0 && failedAt <= Date.now() / 1000, 'the last sync stays the last good poll');
  await until(() => link.logs.filter((l) => l.msg?.startsWith('state poll failed')).length >= FAULTS, 'every fault met');
  await until(async () => (s = await scrape(port)).value('agent_connectors_link_state', { state: 'synced' }) === 1, 'synced again');
  t.equal(s.value('agent_connectors_link_polls_total', { result: 'retry' }), link.logs.filter((l) => l.msg?.startsWith('state poll failed')).length);
  t.equal(s.value('agent_connectors_link_polls_total', { result: 'state' }), link.logs.filter((l) => l.msg === 'desired state handed over to apply').length);
  t.ok(s.value('agent_connectors_link_last_sync_timestamp_seconds') > failedAt, 'a newer sync after the faults');
  t.same(leakedSecrets(s.text), []);
});

t.test('--metrics-listen with a one-shot run is refused (nothing could scrape it)', async (t) => {
  const rig = await makeRig(t);
  const { exit, proc } = await rig.fetchOnce(['--metrics-listen', '127.0.0.1:0']);
  t.equal(exit.code, 2);
  t.match(proc.stderr.join('\n'), /--once exits before anything could scrape it/);
});

checkNoLeaks(t);
