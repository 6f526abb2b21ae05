import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { knownSecrets, checkNoLeaks, leakedSecrets, startCli, type CliProc } from '../test/support/cli-proc.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { assertJsonError, send } from './helpers/http-raw.js';

/*
 * `agent-connectors dev` as a real process: a managed host (SPEC §8) and its demo platform.
 * It enrols with a pairing code it prints, and bindings and providers reach the host only
 * through the desired state: `dev connect|disconnect` (another process) or the demo
 * platform's page change it, and the proxies follow with no file edited by hand.
 */

/** The pids of `pid` and every process below it, from /proc (bounded: one line each). */
function processTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue;
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    children.set(ppid, [...(children.get(ppid) ?? []), Number(name)]);
  }
  const out: number[] = [];
  const walk = (p: number): void => {
    out.push(p);
    for (const c of children.get(p) ?? []) walk(c);
  };
  walk(pid);
  return out;
}

/** Runs `dev connect|disconnect …` to its end; its stdout lines. */
async function control(t: TapTest, stateDir: string, words: string[]): Promise<string[]> {
  const proc = startCli(['dev', ...words, '--state-dir', stateDir]);
  const exit = await proc.exited;
  t.equal(exit.code, 0, `dev ${words.join(' ')} exits 0${exit.code === 0 ? '' : `: ${proc.lines.join(' | ')}`}`);
  return proc.lines;
}

/** The figure the control command printed ("served after N ms", "gone after N ms"). */
function figure(lines: string[]): number | undefined {
  const m = lines.map((l) => / after (\d+) ms/.exec(l)).find((x) => x !== null);
  return m ? Number(m[1]) : undefined;
}

/** dev's /metrics, read whole (bounded: a few hundred series). */
async function scrape(t: TapTest, url: string): Promise<string> {
  const res = await request(url);
  const text = await res.body.text();
  t.equal(res.statusCode, 200, 'scrape answers 200');
  t.ok(text.length < 1024 * 1024, `scrape of ${text.length} bytes`);
  return text;
}

/** The sum of the samples named `name` whose labels include all of `labels`. */
function total(text: string, name: string, labels: Record<string, string>): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (m?.[1] !== name) continue;
    const has = Object.entries(labels).every(([k, v]) => (m[2] ?? '').split(',').includes(`${k}="${v}"`));
    if (has) sum += Number(m[3]);
  }
  return sum;
}

/** A line dev says from `from` (an index of its stderr) on. */
async function waitForSay(dev: CliProc, re: RegExp, from = 0): Promise<RegExpExecArray> {
  return dev.waitForStderr(re, 20_000, from);
}

t.test('dev: a real MCP client lists and calls the demo tools through the forwarder; one /metrics shows every part', async (t) => {
  const stateDir = tempDir('ac-dev-');
  const dev = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0']);
  t.teardown(() => dev.stop('SIGKILL'));
  const url = (await dev.waitForStderr(/MCP URL:\s+(\S+)/, 15_000))[1] as string;
  t.match(url, /^http:\/\/127\.0\.0\.1:\d+\/i\/demo_[A-Za-z0-9_-]+\/mcp$/);
  const metricsUrl = (await dev.waitForStderr(/metrics:\s+(\S+)/, 15_000))[1] as string;
  t.match(metricsUrl, /^http:\/\/127\.0\.0\.1:\d+\/metrics$/, 'the banner prints the metrics URL');

  // The first token comes from renew fetch + apply against the demo Gateway.
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo');
  const tokenFile = join(stateDir, 'mcp-forwarder', 'demo.token');
  t.equal(statSync(tokenFile).mode & 0o777, 0o600, 'demo token file is 0600');
  knownSecrets.add(readFileSync(tokenFile, 'utf8').trim());

  for (const agent of ['claude mcp add --transport http connectors', 'codex mcp add connectors --url', 'openclaw mcp add connectors --url']) {
    t.ok(dev.stderr.some((l) => l.includes(agent) && l.includes(url)), `prints: ${agent}`);
  }

  const client = new Client({ name: 'dev-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const tools = (await client.listTools()).tools.map((x) => x.name).sort();
  t.same(tools, ['add', 'count', 'echo', 'whoami']);
  const sum = await client.callTool({ name: 'add', arguments: { a: 2, b: 40 } });
  t.same(sum.content, [{ type: 'text', text: '42' }]);
  const progress: number[] = [];
  const counted = await client.callTool({ name: 'count', arguments: { n: 3, delayMs: 10 } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
  });
  t.same(counted.content, [{ type: 'text', text: 'counted to 3' }]);
  t.same(progress, [1, 2, 3], 'progress streamed over SSE through the forwarder');
  await transport.terminateSession();
  await client.close();

  // Access lines are written in batches (every 20 ms): wait for the session's last one,
  // the DELETE; the lines before it are in the log by then.
  await dev.waitForLog((l) => l.msg === 'access' && l.method === 'DELETE');
  const access = dev.logs.filter((l) => l.msg === 'access' && l.mcpMethod === 'tools/call');
  t.equal(access.length, 2, 'one access line per tools/call');

  // The shell CLI line printed by dev works as printed: shim → cli-proxy → demo API.
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'cli:demo');
  knownSecrets.add(readFileSync(join(stateDir, 'cli-proxy', 'demo.token'), 'utf8').trim());
  const line = dev.stderr.find((l) => l.includes('acdemo whoami'))?.trim() ?? '';
  t.match(line, /^PATH=\S+:\S+:\$PATH acdemo whoami$/, 'prints a runnable shim command');
  const out = execFileSync('sh', ['-c', line], { encoding: 'utf8' });
  t.match(out, /"provider":"demo","tokenId":"tid_/, 'the demo API answered the shimmed CLI');
  t.notMatch(out, readFileSync(join(stateDir, 'cli-proxy', 'demo.token'), 'utf8').trim(), 'no token in the CLI output');
  // The call is audited: the link part uploads its event and the demo Gateway logs it.
  const audited = await dev.waitForLog((l) => l.msg === 'audit event received' && l.provider === 'demo', 15_000);
  t.match(audited, { method: 'GET', status: 200, path: /^\/[^?]*$/ }, 'dev shows the event the demo Gateway received');

  // Every part's series in one exposition, each with its part; the access lines waited
  // for above are written right before their request's metrics.
  const text = await scrape(t, metricsUrl);
  const families = [...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]);
  t.same(families, [...new Set(families)], 'each metric family once (a valid exposition)');
  const MCP_OPS = 'mcp_server_operation_duration_seconds_count';
  t.equal(total(text, MCP_OPS, { part: 'forwarder', mcp_method_name: 'tools/call', gen_ai_tool_name: 'add' }), 1, 'forwarder: the add call');
  t.equal(total(text, MCP_OPS, { part: 'forwarder', mcp_method_name: 'tools/call', gen_ai_tool_name: 'count' }), 1, 'forwarder: the count call');
  const REQS = 'http_server_request_duration_seconds_count';
  t.ok(total(text, REQS, { part: 'forwarder', http_route: 'mcp' }) >= 5, 'forwarder: the session\'s requests (initialize … DELETE)');
  t.equal(total(text, REQS, { part: 'forwarder', http_route: 'provider' }), 0, 'no provider route on the forwarder');
  t.equal(total(text, REQS, { part: 'cli-proxy', http_route: 'provider', http_response_status_code: '200' }), 1, 'cli-proxy: the shimmed CLI call');
  t.equal(total(text, REQS, { part: 'cli-proxy', http_route: 'mcp' }), 0, 'the MCP calls are not counted for the cli-proxy');
  const states = ['starting', 'synced', 'retrying', 'halted', 'no_credential'].map((state) => total(text, 'agent_connectors_link_state', { part: 'link', state }));
  t.same(states.slice().sort(), [0, 0, 0, 0, 1], `link: one state set (${states.join(' ')})`);
  t.ok(total(text, 'agent_connectors_renewal_iterations_total', { part: 'link', result: 'renewed' }) >= 2, 'link: the renewals that gave both tokens');
  t.ok(total(text, 'agent_connectors_apply_tokens_total', { part: 'apply', result: 'applied' }) >= 2, 'apply: the tokens it applied');
  t.equal(total(text, 'agent_connectors_build_info', {}), 4, 'build info once per part');
  t.match(text, /^process_cpu_seconds_total\{part="dev"\} /m, 'process series once, as part dev');
  t.equal(text.match(/^process_cpu_seconds_total/gm)?.length, 1);
  t.same(leakedSecrets(text), [], 'no token in the scrape');
  t.notMatch(text, /demo_[A-Za-z0-9_-]{8,}|"a":2|\/i\//, 'no binding id, argument or path in any label');
  const rebound = await request(metricsUrl, { headers: { host: 'evil.example' } });
  await rebound.body.dump();
  t.equal(rebound.statusCode, 403, 'a non-loopback Host is refused');

  // A second run reuses the same binding id, so a configured agent keeps working.
  await dev.stop('SIGTERM');
  const again = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0']);
  t.teardown(() => again.stop('SIGKILL'));
  const url2 = (await again.waitForStderr(/MCP URL:\s+(\S+)/, 15_000))[1] as string;
  t.equal(url2.replace(/:\d+\//, ':P/'), url.replace(/:\d+\//, ':P/'), 'same binding id across runs');
  await again.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo');
  knownSecrets.add(readFileSync(tokenFile, 'utf8').trim());
});

t.test('dev: a managed host; connect and disconnect in the demo platform reach it through its link', async (t) => {
  const stateDir = tempDir('ac-dev-link-');
  const dev = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--metrics-listen', 'off']);
  t.teardown(() => dev.stop('SIGKILL'));
  const pid = dev.child.pid as number;

  // Enrolment: the code dev prints is spent through the enroll code path, never in argv.
  const code = (await waitForSay(dev, /pairing code (\S+)/))[1] as string;
  const enrolled = await waitForSay(dev, /enrolled as host (\S+) at (\S+);/);
  t.match(enrolled[2], /^http:\/\/127\.0\.0\.1:\d+$/, 'enrolled at the demo Gateway');
  const credential = readFileSync(join(stateDir, 'host-credential'), 'utf8').trim();
  knownSecrets.add(credential);
  t.equal(statSync(join(stateDir, 'host-credential')).mode & 0o777, 0o600, 'host credential stored 0600');
  t.match(readFileSync(join(stateDir, 'link.env'), 'utf8'), `AGENT_CONNECTORS_HOST_ID=${enrolled[1]}`, 'link.env names the host');
  const mcp = (await waitForSay(dev, /MCP URL:\s+(\S+)/))[1] as string;
  await waitForSay(dev, /metrics:\s+off \(--metrics-listen/);
  t.notOk(dev.logs.some((l) => l.msg === 'metrics listening'), 'metrics off: no metrics port');
  await waitForSay(dev, /host: binding demo now served at /);
  for (const p of processTree(pid)) {
    const argv = readFileSync(`/proc/${p}/cmdline`, 'utf8');
    t.notOk(argv.includes(code) || argv.includes(credential), `no pairing code or credential in the argv of pid ${p}`);
    t.notOk(readFileSync(`/proc/${p}/environ`, 'utf8').includes(code), `no pairing code in the environment of pid ${p}`);
  }
  t.notOk(dev.lines.filter((l) => l.startsWith('{')).some((l) => l.includes(code)), 'no log line carries the pairing code');

  const forwarder = new URL(mcp).origin;
  const runtime = JSON.parse(readFileSync(join(stateDir, 'dev.json'), 'utf8')) as { gateway: string; cliProxy: string; bindingIds: Record<string, string> };
  t.equal(statSync(join(stateDir, 'dev.json')).mode & 0o777, 0o600, 'dev.json (binding ids) is 0600');
  const sandboxUrl = `${forwarder}/i/${runtime.bindingIds.sandbox}/mcp`;
  const figures: Record<string, number[]> = { connect: [], disconnect: [] };
  const record = (kind: 'connect' | 'disconnect', lines: string[]): void => {
    const ms = figure(lines);
    if (ms !== undefined) figures[kind]?.push(ms);
  };

  // A binding connected in the platform (CLI): a real SDK client lists its tools.
  const connected = await control(t, stateDir, ['connect', 'binding', 'sandbox']);
  record('connect', connected);
  t.ok(connected.some((l) => l.includes(`served after`) && l.includes(sandboxUrl)), 'connect waits until the host serves it');
  await waitForSay(dev, /host: binding sandbox now served at /);
  const sandboxToken = join(stateDir, 'mcp-forwarder', 'sandbox.token');
  knownSecrets.add(readFileSync(sandboxToken, 'utf8').trim());
  const client = new Client({ name: 'dev-link-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(sandboxUrl)));
  t.same((await client.listTools()).tools.map((x) => x.name).sort(), ['add', 'count', 'echo', 'whoami'], 'tools listed through the forwarder');
  await client.close();

  // The provider: disconnected, then connected again through the page's form (HTTP).
  let mark = dev.stderr.length;
  record('disconnect', await control(t, stateDir, ['disconnect', 'provider', 'demo']));
  await waitForSay(dev, /host: provider demo disconnected: token file deleted/, mark);
  const page = await send(`${runtime.gateway}/demo`, { method: 'GET', headers: {} });
  t.match(page.body, /action="\/demo\/connect\/provider\/demo"/, 'the page offers to connect the provider');
  t.notMatch(page.body, runtime.bindingIds.sandbox as string, 'the page shows no binding id');
  const clicked = await send(`${runtime.gateway}/demo/connect/provider/demo`, { method: 'POST', headers: { origin: runtime.gateway }, body: '' });
  t.equal(clicked.status, 303, 'a form post answers with the page again');
  await waitForSay(dev, /host: provider demo now served by the cli-proxy/, mark);
  const providerToken = join(stateDir, 'cli-proxy', 'demo.token');
  knownSecrets.add(readFileSync(providerToken, 'utf8').trim());
  const line = dev.stderr.find((l) => l.includes('acdemo whoami'))?.trim() ?? '';
  const out = execFileSync('sh', ['-c', line], { encoding: 'utf8' });
  t.match(out, /"provider":"demo","tokenId":"tid_/, 'the reconnected provider answers the shimmed CLI');

  // Disconnect everything: 404 from both proxies, token files and the shim gone.
  mark = dev.stderr.length;
  for (const words of [['disconnect', 'binding', 'sandbox'], ['disconnect', 'binding', 'demo'], ['disconnect', 'provider', 'demo']]) {
    record('disconnect', await control(t, stateDir, words));
  }
  await waitForSay(dev, /host: binding demo disconnected: token file deleted/, mark);
  await waitForSay(dev, /host: provider demo disconnected: token file deleted/, mark);
  assertJsonError(t, await send(sandboxUrl), 404, 'unknown_binding', 'sandbox binding');
  assertJsonError(t, await send(mcp), 404, 'unknown_binding', 'demo binding');
  assertJsonError(t, await send(`${runtime.cliProxy}/p/demo/whoami`, { method: 'GET', headers: {} }), 404, 'unknown_provider', 'demo provider');
  for (const file of [sandboxToken, join(stateDir, 'mcp-forwarder', 'demo.token'), providerToken]) t.notOk(existsSync(file), `${file} deleted`);
  t.notOk(existsSync(join(stateDir, 'shims', 'acdemo')), 'the shim left with its provider');

  // One more round for the figures (printed, never asserted: timing belongs in bench/;
  // docs/host-link.md has a larger sample).
  for (let i = 0; i < 1; i++) {
    record('connect', await control(t, stateDir, ['connect', 'binding', 'sandbox']));
    record('disconnect', await control(t, stateDir, ['disconnect', 'binding', 'sandbox']));
  }
  t.comment(`dev: connect → served ${JSON.stringify(figures.connect)} ms; disconnect → 404 ${JSON.stringify(figures.disconnect)} ms`);

  // An unknown name is a usage error; with dev stopped, the command says so.
  const unknown = startCli(['dev', 'connect', 'binding', 'nope', '--state-dir', stateDir]);
  t.equal((await unknown.exited).code, 2, 'unknown demo connection: exit 2');
  await dev.stop('SIGTERM');
  const stopped = startCli(['dev', 'connect', 'binding', 'sandbox', '--state-dir', stateDir]);
  t.equal((await stopped.exited).code, 2, 'no dev running: exit 2');
  t.ok(stopped.stderr.some((l) => l.includes('no agent-connectors dev is running')), 'says dev is not running');
});

t.test('dev: renewal rotates the token under a live MCP session', async (t) => {
  const stateDir = tempDir('ac-dev-rot-');
  const dev = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0', '--token-lifetime-s', '3']);
  t.teardown(() => dev.stop('SIGKILL'));
  const url = (await dev.waitForStderr(/MCP URL:\s+(\S+)/, 15_000))[1] as string;
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo');
  const tokenFile = join(stateDir, 'mcp-forwarder', 'demo.token');
  const client = new Client({ name: 'dev-rotation', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const session = transport.sessionId;
  const seen = new Set<string>();
  // Each round waits for a renewal applied after it read the token; at worst every other
  // round sees the token of the round before, so six rounds see three tokens.
  for (let round = 0; round < 6 && seen.size < 3; round++) {
    const mark = dev.logs.length;
    knownSecrets.add(readFileSync(tokenFile, 'utf8').trim());
    const r = await client.callTool({ name: 'whoami', arguments: {} });
    const text = (r.content as Array<{ type: string; text: string }>)[0]?.text ?? '{}';
    seen.add((JSON.parse(text) as { tokenId: string }).tokenId);
    t.equal(transport.sessionId, session, 'same MCP session');
    if (seen.size < 3) await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo', 20_000, mark);
  }
  t.ok(seen.size >= 3, `the Gateway saw ${seen.size} distinct token ids in one session`);
  t.ok(dev.logs.filter((l) => l.msg === 'renewed; handed to apply').length >= 3, 'fetch logged the renewals');
  await client.close();
});

t.test('dev --metrics-listen refuses a non-loopback address and a part\'s own port (exit 2)', async (t) => {
  for (const [address, why] of [
    ['0.0.0.0:0', /--metrics-listen must be a loopback address/],
    ['127.0.0.1:14399', /--metrics-listen must not be the part's own port \(14399\)/],
  ] as const) {
    const proc = startCli(['dev', '--state-dir', tempDir('ac-dev-metrics-'), '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:14399', '--metrics-listen', address]);
    t.teardown(() => proc.stop('SIGKILL'));
    t.equal((await proc.exited).code, 2, `--metrics-listen ${address}`);
    t.match(proc.stderr.join('\n'), why);
  }
});

checkNoLeaks(t);
