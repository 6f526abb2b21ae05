import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import t from 'tap';
import { ensureAgentUser } from '../test/support/agent-user.js';
import { allProcs, checkNoLeaks, knownSecrets, leakedSecrets } from '../test/support/cli-proc.js';
import { MockGateway } from '../test/support/mock-gateway.js';
import { until } from '../test/support/poll.js';
import { send } from './helpers/http-raw.js';
import { appliedLine, filesHolding, filesUnder, hostWorld, type HostWorld } from './helpers/host-link-rig.js';
import { bearerToken, McpUpstream } from './helpers/mcp-upstream.js';
import { hasSlot } from './helpers/slots.js';
import { holdStream } from './helpers/held-stream.js';

/*
 * The host link end to end (SPEC §8), every part a real process and no file written by
 * the test: `enroll` (code on stdin) → `link` → `renew apply --watch` → forwarder and
 * cli-proxy. The mock Gateway connects a binding and a provider; a real MCP SDK client
 * lists tools through the forwarder with a token the link renewed; the cli-proxy injects
 * the provider's renewed token. Then the Gateway disconnects one binding and one provider
 * while requests flow: their token files go, both proxies answer 404, an SSE stream open
 * through the dropped binding ends whole, and no byte of their tokens is left on disk.
 * Last, the secrets: never in argv or the environment of any process, a log line at trace
 * level, a presence body, or a file the agent UID could read.
 */

const KEPT = 'bind_e2e_KEPT_0001';
const DROPPED = 'bind_e2e_DROP_0002';
const KEPT_PROVIDER = 'e2ekept';
const DROPPED_PROVIDER = 'e2edrop';

const world: HostWorld = await hostWorld(t, { proxies: true, tokenLifetimeMs: 120_000 });
const mcpUp = await McpUpstream.start({
  check: (token) => {
    const valid = token === undefined ? undefined : world.gw.authority.isValidToken(token);
    return valid ? { ok: true, tokenId: valid.tokenId } : { ok: false, problem: 'not a live token of the Gateway' };
  },
});
t.teardown(() => mcpUp.close());
const api = await MockGateway.start();
t.teardown(() => api.close());
// The session outlives the first subtest: the disconnect runs requests through it.
t.teardown(() => client?.close());

const fwd = world.fwd!;
const cliProxy = world.cli!;
const provider = (name: string) => ({
  upstream: api.url(`/api/${name}`),
  inject: { type: 'header' as const, name: 'Authorization', value: 'Bearer {token}' },
  commands: [{ name: `${name}-cli`, env: {} }],
});
const mcpPost = (binding: string) => send(`${fwd.base}/i/${binding}/mcp`, { body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' });
const apiGet = (name: string) => send(`${cliProxy.base}/p/${name}/user`, { method: 'GET', headers: {} });
const figures: Record<string, number> = {};
let client: Client | undefined;
const keptErrors: string[] = [];

/** One request through the kept binding: an MCP tool call by the SDK client (200 or its failure). */
async function keptCall(): Promise<number> {
  try {
    await client!.callTool({ name: 'echo', arguments: { text: 'flow' } });
    return 200;
  } catch (err) {
    keptErrors.push(String(err));
    return 0;
  }
}

/**
 * A dropped route's answers in order: served, then possibly 503 `token_unavailable` (the
 * token file is gone a moment before the proxy has reloaded its config), then 404 for
 * good. Never served again once it stopped.
 */
function dropSequenceOk(list: number[]): boolean {
  const rank = (s: number) => (s === 200 ? 0 : s === 503 ? 1 : s === 404 ? 2 : -1);
  return list.every((s, i) => rank(s) >= 0 && (i === 0 || rank(s) >= rank(list[i - 1] as number)));
}

t.test('enrol → link → apply: the forwarder serves a new binding and the cli-proxy a new provider with tokens the link renewed', async (t) => {
  const apply = world.startApply();
  await apply.waitForLog((l) => l.msg === 'apply watching', 15_000);
  const link = world.startLink();
  await link.waitForLog((l) => l.msg === 'desired state handed over to apply' && l.version === 1, 15_000);
  await apply.waitForLog(appliedLine(1), 15_000);

  const t0 = Date.now();
  world.gw.control.connectBinding(KEPT, { instanceId: 'inst-kept', upstreamUrl: mcpUp.url('/mcp') });
  world.gw.control.connectBinding(DROPPED, { instanceId: 'inst-drop', upstreamUrl: api.url('/mcp/drop') });
  world.gw.control.connectProvider(KEPT_PROVIDER, provider(KEPT_PROVIDER));
  world.gw.control.connectProvider(DROPPED_PROVIDER, provider(DROPPED_PROVIDER));
  const version = world.gw.control.version;
  await apply.waitForLog(appliedLine(version), 15_000);
  for (const f of [world.instanceToken('inst-kept'), world.instanceToken('inst-drop'), world.providerToken(KEPT_PROVIDER), world.providerToken(DROPPED_PROVIDER)]) {
    await until(() => existsSync(f), `token file ${f} renewed by the link and applied`, 15_000);
  }
  await until(async () => (await mcpPost(DROPPED)).status === 200 && (await apiGet(DROPPED_PROVIDER)).status === 200, 'both proxies serving', 15_000);
  figures.connectToServingMs = Date.now() - t0;

  client = new Client({ name: 'host-link-e2e', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(`${fwd.base}/i/${KEPT}/mcp`));
  await client.connect(transport);
  const tools = (await client.listTools()).tools.map((x) => x.name).sort();
  t.same(tools, ['echo', 'progress'], 'a real MCP client lists the tools through the forwarder');
  const echoed = await client.callTool({ name: 'echo', arguments: { text: 'hi' } });
  t.same(echoed.content, [{ type: 'text', text: 'echo: hi' }]);
  const kept = mcpUp.seen.filter((s) => s.method === 'POST');
  t.ok(kept.length >= 2, 'the upstream saw the session');
  t.ok(kept.every((s) => s.valid), 'every MCP request carried a live token the Gateway minted');
  t.ok(kept.every((s) => s.token !== undefined && world.minted.get('instance:inst-kept')?.has(s.token)), 'minted for this binding\'s slot, renewed by the link');

  const mark = api.requests.length;
  t.equal((await apiGet(KEPT_PROVIDER)).status, 200, 'the cli-proxy serves the new provider');
  const seen = api.requests.slice(mark).find((r) => r.url.startsWith(`/api/${KEPT_PROVIDER}`));
  const injected = bearerToken(seen?.headers.authorization as string | undefined);
  t.ok(injected !== undefined && world.minted.get(`cli:${KEPT_PROVIDER}`)?.has(injected), 'with the provider token the link renewed');
  t.ok(injected !== undefined && world.gw.authority.isValidToken(injected), 'a live token');
  t.ok(existsSync(join(world.shimDir, `${KEPT_PROVIDER}-cli`)), 'its shim rendered');
  t.comment(`connect → both proxies serving: ${figures.connectToServingMs} ms`);
});

t.test('disconnect while requests flow: token files gone, both proxies 404, an open SSE stream ends whole, no byte of the old tokens on disk', async (t) => {
  const droppedTokens = [...(world.minted.get('instance:inst-drop') ?? []), ...(world.minted.get(`cli:${DROPPED_PROVIDER}`) ?? [])];
  t.ok(droppedTokens.length >= 2, 'the dropped binding and provider had tokens');

  // An SSE stream through the binding about to be dropped, open across the disconnect.
  const { reader, stream, first: ev1 } = await holdStream(api, `${fwd.base}/i/${DROPPED}/mcp`);

  // Requests flowing on all four routes until the drop has been seen by both proxies.
  const statuses: Record<string, number[]> = { [DROPPED]: [], [DROPPED_PROVIDER]: [], [KEPT]: [], [KEPT_PROVIDER]: [] };
  const unavailable: string[] = [];
  let flowing = true;
  const flow = (async () => {
    while (flowing) {
      const [a, b, c, d] = await Promise.all([mcpPost(DROPPED), apiGet(DROPPED_PROVIDER), keptCall(), apiGet(KEPT_PROVIDER)]);
      statuses[DROPPED]!.push(a.status);
      statuses[DROPPED_PROVIDER]!.push(b.status);
      for (const r of [a, b]) if (r.status === 503) unavailable.push(r.body);
      statuses[KEPT]!.push(c);
      statuses[KEPT_PROVIDER]!.push(d.status);
    }
  })();
  await until(() => statuses[DROPPED]!.length >= 3, 'requests flowing');

  const t0 = Date.now();
  world.gw.control.disconnectBinding(DROPPED);
  world.gw.control.disconnectProvider(DROPPED_PROVIDER);
  await until(() => !existsSync(world.instanceToken('inst-drop')) && !existsSync(world.providerToken(DROPPED_PROVIDER)), 'token files deleted', 15_000);
  figures.disconnectToDeletedMs = Date.now() - t0;
  await until(() => statuses[DROPPED]!.at(-1) === 404 && statuses[DROPPED_PROVIDER]!.at(-1) === 404, 'both proxies answer 404', 15_000);
  figures.disconnectTo404Ms = Date.now() - t0;
  const settled = statuses[DROPPED]!.length;
  await until(() => statuses[DROPPED]!.length >= settled + 3, 'a few more requests after the 404');
  flowing = false;
  await flow;

  t.same(keptErrors, [], 'no kept call failed');
  t.ok(unavailable.every((b) => b.includes('token_unavailable')), 'a 503 on the way is token_unavailable, nothing else');
  for (const route of [KEPT, KEPT_PROVIDER]) t.same([...new Set(statuses[route])], [200], `${route}: served throughout`);
  for (const route of [DROPPED, DROPPED_PROVIDER]) {
    const list = statuses[route]!;
    t.equal(list[0], 200, `${route}: served before the drop`);
    t.ok(dropSequenceOk(list), `${route}: 200s, then at most 503s, then 404 for good (${[...new Set(list)].join(' → ')})`);
    figures[`${route === DROPPED ? 'forwarder' : 'cliProxy'}503s`] = list.filter((s) => s === 503).length;
  }

  const ev2 = 'event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{}}\n\n';
  stream.send(ev2);
  stream.end();
  t.same(await reader.ended, { kind: 'end' }, 'the in-flight stream ended cleanly');
  t.equal(reader.text(), ev1 + ev2, 'every event arrived whole: not cut mid-event');

  const version = world.gw.control.version;
  await until(() => {
    try {
      return (JSON.parse(readFileSync(join(world.handoff, 'applied-state.json'), 'utf8')) as { version: number }).version === version;
    } catch {
      return false;
    }
  }, 'the disconnect in force');
  t.notOk(hasSlot(world.handoff, 'instance:inst-drop'), 'the dropped binding\'s slot retired');
  t.notOk(existsSync(join(world.shimDir, `${DROPPED_PROVIDER}-cli`)), 'the dropped provider\'s shim removed');
  t.ok(existsSync(world.instanceToken('inst-kept')) && existsSync(world.providerToken(KEPT_PROVIDER)), 'the kept ones keep their tokens');
  t.same(filesHolding(world.root, droppedTokens), [], 'no file under the state roots, the hand-off or the credential directory holds a dropped token');
  t.comment(`disconnect → token files deleted: ${figures.disconnectToDeletedMs} ms; → both proxies 404: ${figures.disconnectTo404Ms} ms`);
});

/** The pids of `pid` and every process below it. */
function processTree(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const ppid = /^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${entry}/status`, 'utf8'))?.[1];
      if (Number(ppid) === pid) children.push(Number(entry));
    } catch {
      // Gone while we looked.
    }
  }
  return [pid, ...children.flatMap(processTree)];
}

t.test('secrets: the pairing code, the host credential and every token in no argv, environment, presence body or file the agent UID can read', async (t) => {
  const secrets = [...knownSecrets];
  const credential = readFileSync(world.credential, 'utf8').trim();
  t.ok(secrets.includes(credential) && secrets.includes(world.codes[0]!), 'the credential and the pairing code are among the secrets searched for');
  t.ok([...world.minted.values()].reduce((n, s) => n + s.size, 0) >= 4, 'tokens minted to search for');

  const live = allProcs.filter((p) => p.child.exitCode === null && p.child.signalCode === null && p.child.pid !== undefined);
  t.ok(live.length >= 4, 'link, apply, forwarder and cli-proxy running');
  let seenProcs = 0;
  for (const pid of live.flatMap((p) => processTree(p.child.pid as number))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
      const environ = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').join('\n');
      seenProcs += 1;
      t.same(leakedSecrets(cmdline), [], `no secret in the argv of ${pid}`);
      t.same(leakedSecrets(environ), [], `no secret in the environment of ${pid}`);
    } catch {
      // Ended while we looked.
    }
  }
  t.ok(seenProcs >= 4, 'argv and environment of each process read');
  for (const p of allProcs) t.same(leakedSecrets(p.child.spawnargs.join(' ')), [], `no secret in the argv given to ${p.child.spawnargs[3] ?? '?'} ${p.child.spawnargs[4] ?? ''}`);

  await until(() => world.gw.control.presences.length >= 2, 'presence reports');
  t.same(leakedSecrets(JSON.stringify(world.gw.control.presences)), [], 'no secret in any presence body the Gateway received');
  t.ok(world.gw.requests.every((r) => !leakedSecrets(r.path).length), 'no secret in any link URL');

  const agent = ensureAgentUser();
  const holding = filesHolding(world.root, secrets);
  t.ok(holding.includes(world.credential) && holding.includes(world.instanceToken('inst-kept')), 'the files that hold secrets were found');
  for (const f of holding) {
    const st = statSync(f);
    const groupReadable = (st.mode & 0o040) !== 0 && st.gid === agent.gid;
    t.ok(st.uid !== agent.uid && (st.mode & 0o004) === 0 && !groupReadable, `${f.slice(world.root.length)}: ${(st.mode & 0o777).toString(8)} ${st.uid}:${st.gid}, unreadable by the agent UID`);
  }
  t.ok(filesUnder(world.root).length > holding.length, 'other files were checked and hold nothing secret');
});

t.test('figures', async (t) => {
  t.comment(`FIGURES host-link-e2e ${JSON.stringify(figures)}`);
  t.pass();
});

checkNoLeaks(t);
