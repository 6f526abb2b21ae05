/**
 * Argument shims and provider ports (SPEC §10, issue 20 item 3), with real processes: a
 * CLI that takes its base URL and key only as flags runs through its shim as the agent
 * UID; a CLI that drops the base URL's path reaches its provider on a port of its own,
 * through the same pipeline (peer check, token injection, access log); a catalog whose
 * args break the rules is rejected whole, by the running cli-proxy and by `shims install`.
 */
import { chmodSync, chownSync, copyFileSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { asRootWithAgent, runAsAgent, type AgentRunResult, type AgentUser } from '../test/support/agent-user.js';
import { leakedSecrets, REPO_ROOT, startCli, writeJsonAtomic, writeToken } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { startProxy } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';

const FIXTURE = join(REPO_ROOT, 'contract-tests/fixtures/args-cli.sh');
const STRIPE_TOKEN = `tok-args-stripe-REAL-${process.pid}-5e0c1a`;
const DROP_TOKEN = `tok-args-drop-REAL-${process.pid}-9f2b44`;
const STRIPE_PLACEHOLDER = 'sk_test_agentconnectors000000000000';

/** A free port in the provider-port range (other files may be using some of it). */
async function freeProviderPort(): Promise<number> {
  for (let port = 18300 + (process.pid % 100), i = 0; i < 100; i++, port = 18300 + ((port - 18300 + 1) % 100)) {
    const free = await new Promise<boolean>((resolve) => {
      const s = createServer();
      s.once('error', () => resolve(false));
      s.listen({ host: '127.0.0.1', port, exclusive: true }, () => s.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error('no free port in 18300-18399');
}

await asRootWithAgent(t, 'ac-args-', main);

async function main(agent: AgentUser, base: string): Promise<void> {
  const state = join(base, 'state');
  mkdirSync(join(state, 'cli-proxy'), { recursive: true, mode: 0o700 });
  chmodSync(state, 0o700);
  const shimDir = join(base, 'shims');
  const binDir = join(base, 'bin');
  mkdirSync(binDir, { mode: 0o755 });
  chmodSync(binDir, 0o755);
  for (const name of ['acstripe', 'acdrop', 'acdroppath']) {
    copyFileSync(FIXTURE, join(binDir, name));
    chmodSync(join(binDir, name), 0o755);
  }
  const home = join(base, 'home');
  mkdirSync(home, { mode: 0o700 });
  chownSync(home, agent.uid, agent.gid);
  const stripeTokenFile = join(state, 'cli-proxy', 'stripe.token');
  const dropTokenFile = join(state, 'cli-proxy', 'drop.token');
  writeToken(stripeTokenFile, STRIPE_TOKEN);
  writeToken(dropTokenFile, DROP_TOKEN);

  // Each provider's API answers only its real token, and only under its own path.
  const api = await MockGateway.start();
  t.teardown(() => api.close());
  api.handle((req, res) => {
    const want = req.url.startsWith('/stripe/') ? STRIPE_TOKEN : req.url.startsWith('/drop/') ? DROP_TOKEN : undefined;
    if (want === undefined) return json(res, 404, { error: 'no such path', path: req.url });
    if (req.headers.authorization !== `Bearer ${want}`) return json(res, 401, { error: 'bad token' });
    json(res, 200, { ok: true, path: req.url });
  });

  const port = await freeProviderPort();
  const inject = { type: 'header', name: 'Authorization', value: 'Bearer {token}' };
  const flags = ['--api-base', '{baseUrl}', '--api-key', '{placeholder}'];
  const catalog = {
    stripe: { upstream: api.url('/stripe'), tokenFile: stripeTokenFile, inject, placeholder: STRIPE_PLACEHOLDER, commands: [{ name: 'acstripe', args: flags }] },
    drop: { upstream: api.url('/drop'), tokenFile: dropTokenFile, inject, port, commands: [{ name: 'acdrop', args: flags, env: { AC_ORIGIN_ONLY: '1' } }] },
    // The same CLI without a port: what a provider port is for.
    droppath: { upstream: api.url('/drop'), tokenFile: dropTokenFile, inject, commands: [{ name: 'acdroppath', args: flags, env: { AC_ORIGIN_ONLY: '1' } }] },
  };
  // The peer check on: only the agent UID is served (root, this test, is refused).
  const proxy = await startProxy(t, 'cli-proxy', { stateDir: state, config: catalog, args: ['--allowed-uids', String(agent.uid)] });
  await proxy.waitForLog((l) => l.msg === 'provider port listening' && l.port === port);
  const install = async (): Promise<{ code: number | null; out: string }> => {
    const p = startCli(['shims', 'install', '--dir', shimDir, '--proxy-url', proxy.base, '--state-dir', state]);
    const { code } = await p.exited;
    return { code, out: p.lines.join('\n') };
  };
  const installed = await install();
  if (installed.code !== 0) throw new Error(`shims install exited ${installed.code}: ${installed.out}`);

  const env = { PATH: [shimDir, binDir, '/usr/bin', '/bin'].join(':'), HOME: home, LANG: 'C.UTF-8' };
  const argvOf = (r: AgentRunResult): string[] => [...r.stdout.matchAll(/^\[(.*)\]$/gm)].map((m) => m[1] as string);
  const secretFree = (tt: TapTest, r: AgentRunResult): void => {
    tt.same(leakedSecrets(`${r.stdout}\n${r.stderr}`), [], 'no token in the output (argv is printed there)');
    for (const name of readdirSync(shimDir)) tt.same(leakedSecrets(readFileSync(join(shimDir, name), 'utf8')), [], `shim ${name} holds no token`);
  };

  t.test('an args shim: base URL and placeholder as flags before the agent\'s own; the upstream sees the real token', async (t) => {
    const before = api.requests.length;
    const r = await runAsAgent(agent, 'acstripe "$1" "$2"', { env, args: ['charges', 'it\'s $(id)'], cwd: home });
    t.equal(r.code, 0, r.stderr);
    t.same(argvOf(r), ['--api-base', `${proxy.base}/p/stripe`, '--api-key', STRIPE_PLACEHOLDER, 'charges', 'it\'s $(id)'], 'the catalog\'s args first, expanded, then the agent\'s verbatim');
    t.match(r.stdout, /"ok":true,"path":"\/stripe\/v1\/charges"\}\nhttp=200\n/, 'the API answered through the proxy');
    t.equal(api.requests[before]?.headers.authorization, `Bearer ${STRIPE_TOKEN}`, 'the upstream saw the real token');
    secretFree(t, r);
  });

  t.test('a provider port: a CLI that drops the base URL\'s path reaches its provider with no /p/ prefix', async (t) => {
    const before = api.requests.length;
    const r = await runAsAgent(agent, 'acdrop items', { env, cwd: home });
    t.equal(r.code, 0, r.stderr);
    t.same(argvOf(r).slice(0, 2), ['--api-base', `http://127.0.0.1:${port}`], '{baseUrl} is the provider port, no path');
    t.match(r.stdout, /"ok":true,"path":"\/drop\/v1\/items"\}\nhttp=200\n/, 'the request reached the provider\'s upstream path');
    t.equal(api.requests[before]?.headers.authorization, `Bearer ${DROP_TOKEN}`, 'with the real token');
    const access = await proxy.waitForLog((l) => l.msg === 'access' && l.provider === 'drop');
    t.equal(access.status, 200, 'the access log names the provider, like a /p/ request');
    secretFree(t, r);
    // Without a port the same CLI loses /p/droppath and the proxy has no route for it.
    const lost = await runAsAgent(agent, 'acdroppath items', { env, cwd: home });
    t.match(lost.stdout, /http=404\n/, 'the same CLI on the /p/ path: not found');
  });

  t.test('a provider port keeps the peer check: a UID not allowed is refused before any upstream call', async (t) => {
    const before = api.requests.length;
    const res = await request(`http://127.0.0.1:${port}/v1/items`, { headers: { authorization: 'Bearer x' } });
    const body = await res.body.text();
    t.equal(res.statusCode, 403, 'root is not in --allowed-uids: 403');
    t.match(body, /forbidden_peer/);
    t.equal(api.requests.length, before, 'the upstream was never called');
  });

  t.test('a catalog whose args break the rules is rejected whole: the running proxy and shims install keep the last good state', async (t) => {
    const shimsBefore = Object.fromEntries(readdirSync(shimDir).map((n) => [n, readFileSync(join(shimDir, n), 'utf8')]));
    const mark = proxy.logs.length;
    const bad = {
      ...catalog,
      // A second line would be a second shell command in a shim.
      stripe: { ...catalog.stripe, commands: [{ name: 'acstripe', args: ['--api-base', '{baseUrl}\ntouch /tmp/pwned'] }] },
      drop: { ...catalog.drop, port: port === 18399 ? 18300 : port + 1 },
    };
    writeJsonAtomic(proxy.configPath, bad);
    const rejected = await proxy.waitForLog((l) => l.msg === 'catalog rejected; keeping last good', 10_000, mark);
    t.match(String(rejected.error), /args/, 'the error names the args');
    const r = await runAsAgent(agent, 'acdrop items', { env, cwd: home });
    t.match(r.stdout, /http=200\n/, 'the old provider port still serves');
    const again = await install();
    t.not(again.code, 0, 'shims install refuses the catalog');
    t.same(Object.fromEntries(readdirSync(shimDir).map((n) => [n, readFileSync(join(shimDir, n), 'utf8')])), shimsBefore, 'the shims are unchanged');
  });

  t.test('a provider port follows the catalog: a good load moves it, the old one stops accepting', async (t) => {
    const moved = await freeProviderPort();
    const mark = proxy.logs.length;
    writeJsonAtomic(proxy.configPath, { ...catalog, drop: { ...catalog.drop, port: moved } });
    await proxy.waitForLog((l) => l.msg === 'provider port listening' && l.port === moved, 10_000, mark);
    await proxy.waitForLog((l) => l.msg === 'provider port closed' && l.port === port, 10_000, mark);
    const oldPort = await runAsAgent(agent, 'curl -sS -o /dev/null "http://127.0.0.1:$1/v1/items"', { env, args: [String(port)], cwd: home });
    t.not(oldPort.code, 0, 'the old port refuses connections');
    const r = await runAsAgent(agent, 'curl -sS "http://127.0.0.1:$1/v1/items"', { env, args: [String(moved)], cwd: home });
    t.match(r.stdout, /"path":"\/drop\/v1\/items"/, 'the new port serves the provider (a placeholder-free call gets the real token)');
  });

  t.test('a provider port is never an upstream: a provider pointed at one is refused without a connection', async (t) => {
    const mark = proxy.logs.length;
    const loop = { ...catalog, loop: { upstream: `http://127.0.0.1:${port}/x`, tokenFile: stripeTokenFile, inject, commands: [] } };
    writeJsonAtomic(proxy.configPath, loop);
    await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 4, 10_000, mark);
    const r = await runAsAgent(agent, 'curl -sS -w "\\nhttp=%{http_code}\\n" "$1"', { env, args: [`${proxy.base}/p/loop/v1/items`], cwd: home });
    t.match(r.stdout, /"error":"upstream_loop"[\s\S]*\nhttp=502\n/, 'refused by the upstream guard: 502 upstream_loop');
    t.same(leakedSecrets(`${r.stdout}\n${r.stderr}`), []);
  });
}
