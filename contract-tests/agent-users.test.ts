import { renameSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { checkNoLeaks, type LogLine } from '../test/support/cli-proc.js';
import { ensureAgentUser, killGroup, spawnAsAgent, type AgentUser } from '../test/support/agent-user.js';
import { json, type MockGateway } from '../test/support/mock-gateway.js';
import { forwarderRig, startRig, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { unlessMissing } from '../test/tools/prerequisite.js';

/*
 * Issue 13 (agent-only access): with `--agent-users-file` (what the shipped units pass),
 * both proxies serve only the users the file names, root and their own user. A second
 * local user that is not an agent user is refused on every route with 403 forbidden_peer
 * and nothing reaches the upstream; the file is re-read when edited; an invalid file keeps
 * the last good list; a missing one serves nobody else (fail closed) and says how to fix it.
 */

const isRoot = process.getuid?.() === 0;
const needsRoot = { skip: unlessMissing(t, isRoot ? undefined : 'needs root to create users and run clients as them') };
const BINDING = 'bind_agent_users_01';
const PING = '{"jsonrpc":"2.0","id":1,"method":"ping"}';
const REFUSED = 'connection from a UID not allowed (agent users, --allowed-uids)';

interface Answer {
  uid: number;
  status: number;
  body: string;
}

/**
 * Node's http client run as `user`: one request per connection (agent: false), each
 * answer as a JSON line; bodies cut at 2 KiB, each request bounded by 8 s.
 */
const CLIENT = `
const http = require('http');
const [port, reqs] = process.argv.slice(1);
(async () => {
  for (const [method, path, body] of JSON.parse(reqs)) {
    const r = await new Promise((resolve) => {
      const req = http.request({ host: '127.0.0.1', port: Number(port), method, path, agent: false, timeout: 8000,
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' } }, (res) => {
        let b = '';
        res.setEncoding('utf8');
        res.on('data', (d) => { if (b.length < 2048) b += d; });
        res.on('end', () => resolve({ status: res.statusCode, body: b.slice(0, 2048) }));
      });
      req.on('timeout', () => req.destroy());
      req.on('error', (e) => resolve({ status: 0, body: String(e.code || e) }));
      req.end(body || undefined);
    });
    process.stdout.write(JSON.stringify({ uid: process.getuid(), ...r }) + '\\n');
  }
})();
`;

function asUser(user: AgentUser, port: number, requests: Array<[string, string, string?]>): Promise<Answer[]> {
  return new Promise((resolve, reject) => {
    const child = spawnAsAgent(user, 'exec "$@"', { env: { PATH: '/usr/bin:/bin' }, args: [process.execPath, '-e', CLIENT, String(port), JSON.stringify(requests)] });
    child.stdin!.end();
    let out = '';
    let err = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    const timer = setTimeout(() => killGroup(child), 30_000);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      killGroup(child);
      if (code !== 0) reject(new Error(`client as ${user.name} exited ${code}: ${err}`));
      else resolve(out.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Answer));
    });
  });
}

/** Replaces the file the way an editor or `install` does (rename into place). */
function writeUsers(path: string, text: string): void {
  writeFileSync(`${path}.tmp`, text);
  renameSync(`${path}.tmp`, path);
}

function usersLoaded(uids: number[]): (l: LogLine) => boolean {
  return (l) => l.msg === 'agent users loaded' && JSON.stringify([...((l.uids as number[]) ?? [])].sort()) === JSON.stringify([...uids].sort());
}

const FORWARDER_ROUTES = (b: string): Array<[string, string, string?]> => [
  ['POST', `/i/${b}/mcp`, PING],
  ['GET', `/i/${b}/mcp`],
  ['DELETE', `/i/${b}/mcp`],
  ['PUT', `/i/${b}/mcp`, PING],
  ['POST', '/i/bind_unknown_binding/mcp', PING],
  ['GET', '/healthz'],
  ['GET', '/.well-known/oauth-authorization-server'],
  ['GET', '/'],
];
const CLI_PROXY_ROUTES: Array<[string, string, string?]> = [
  ['GET', '/p/notion/v1/users'],
  ['POST', '/p/notion/v1/pages', '{}'],
  ['DELETE', '/p/notion/v1/blocks/x'],
  ['GET', '/p/unknown/x'],
  ['GET', '/healthz'],
  ['GET', '/'],
];

function gatewayAnswers(gw: MockGateway): void {
  gw.handle((_req, res) => json(res, 200, { jsonrpc: '2.0', id: 1, result: {} }));
}

async function forwarder(tt: TapTest, file: string): Promise<{ fwd: ProxyProc; gw: MockGateway }> {
  const { fwd, gw } = await forwarderRig(tt, { binding: BINDING, token: 'tok-agent-users-fwd-1', args: ['--agent-users-file', file] });
  gatewayAnswers(gw);
  return { fwd, gw };
}

async function cliProxy(tt: TapTest, file: string): Promise<{ proxy: ProxyProc; gw: MockGateway }> {
  const { proc, upstream } = await startRig<MockGateway>(tt, 'cli-proxy', {
    args: ['--agent-users-file', file],
    tokens: { 'notion.token': 'tok-agent-users-cli-1' },
    config: (up, dir) => ({
      notion: { upstream: up.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } },
    }),
  });
  gatewayAnswers(upstream);
  return { proxy: proc, gw: upstream };
}

function assertRefused(tt: TapTest, answers: Answer[], user: AgentUser, n: number, what: string): void {
  tt.equal(answers.length, n, `${what}: every request answered`);
  for (const a of answers) {
    tt.equal(a.uid, user.uid, `${what}: the client really ran as ${user.name}`);
    tt.equal(a.status, 403, `${what}: 403`);
    tt.match(a.body, /"error":"forbidden_peer"/, `${what}: forbidden_peer`);
  }
}

t.test('agent-users file: both proxies refuse a non-agent user on every route, serve the agent user and root; edits apply at runtime; invalid keeps last good', needsRoot, async (t) => {
  const agent = ensureAgentUser();
  const other = ensureAgentUser('ac-peer-other');
  const file = join(tempDir('ac-agent-users-', t), 'agent-users');
  writeUsers(file, `# the agents of this host\n${agent.name}   # Claude Code runs as this user\n\n`);

  const { fwd, gw } = await forwarder(t, file);
  const { proxy, gw: api } = await cliProxy(t, file);
  for (const p of [fwd, proxy]) {
    await p.waitForLog(usersLoaded([agent.uid]));
    const ready = await p.waitForLog((l) => l.msg === 'peer check ready');
    t.equal(ready.method, 'sock_diag', `${p.kind}: the constant-cost sock_diag helper was chosen`);
  }

  const fwdRoutes = FORWARDER_ROUTES(BINDING);
  assertRefused(t, await asUser(other, fwd.port, fwdRoutes), other, fwdRoutes.length, 'forwarder, non-agent user');
  assertRefused(t, await asUser(other, proxy.port, CLI_PROXY_ROUTES), other, CLI_PROXY_ROUTES.length, 'cli-proxy, non-agent user');
  t.equal(gw.requests.length, 0, 'the Gateway saw nothing from the non-agent user');
  t.equal(api.requests.length, 0, 'the SaaS API saw nothing from the non-agent user');
  await fwd.waitForLog((l) => l.msg === REFUSED && l.uid === other.uid);

  const [served] = await asUser(agent, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]);
  t.equal(served?.status, 200, 'the agent user is served by the forwarder');
  t.equal(gw.requests[0]?.headers.authorization, 'Bearer tok-agent-users-fwd-1', 'with the file token');
  const [servedCli] = await asUser(agent, proxy.port, [['GET', '/p/notion/v1/users']]);
  t.equal(servedCli?.status, 200, 'the agent user is served by the cli-proxy');
  t.equal(api.requests.length, 1, 'the API got the agent user\'s call');
  const health = await fetch(`${fwd.base}/healthz`);
  t.equal(health.status, 200, 'root is always served (doctor runs as root)');

  // Edited at runtime: the other user added by UID, then removed again.
  let mark = fwd.logs.length;
  let pmark = proxy.logs.length;
  writeUsers(file, `${agent.name}\n${other.uid}\n`);
  await fwd.waitForLog(usersLoaded([agent.uid, other.uid]), 10_000, mark);
  await proxy.waitForLog(usersLoaded([agent.uid, other.uid]), 10_000, pmark);
  t.equal((await asUser(other, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]))[0]?.status, 200, 'added at runtime: served by the forwarder');
  t.equal((await asUser(other, proxy.port, [['GET', '/p/notion/v1/users']]))[0]?.status, 200, 'added at runtime: served by the cli-proxy');

  mark = fwd.logs.length;
  pmark = proxy.logs.length;
  writeUsers(file, `${agent.name}\n`);
  await fwd.waitForLog(usersLoaded([agent.uid]), 10_000, mark);
  await proxy.waitForLog(usersLoaded([agent.uid]), 10_000, pmark);
  assertRefused(t, await asUser(other, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]), other, 1, 'removed at runtime');

  // Invalid: a bad line, then an unknown user. The last good list (the agent only) stays.
  for (const [what, text] of [
    ['a line that is no user name', `${agent.name}\n${other.name} extra words\n`],
    ['an unknown user', `${agent.name}\n${other.uid}\nno-such-user-ac\n`],
  ] as const) {
    const m = fwd.logs.length;
    writeUsers(file, text);
    const rejected = await fwd.waitForLog((l) => typeof l.msg === 'string' && l.msg.startsWith('agent users file rejected'), 10_000, m);
    t.equal(rejected.level, 'error', `${what}: logged as an error`);
    t.equal((await asUser(agent, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]))[0]?.status, 200, `${what}: the agent user is still served`);
    assertRefused(t, await asUser(other, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]), other, 1, `${what}: the last good list stays`);
  }

  // A good file loads again; SIGHUP (systemctl reload) re-reads and re-resolves it as well.
  mark = fwd.logs.length;
  writeUsers(file, `${agent.name}\n`);
  await fwd.waitForLog(usersLoaded([agent.uid]), 10_000, mark);
  mark = fwd.logs.length;
  fwd.child.kill('SIGHUP');
  await fwd.waitForLog(usersLoaded([agent.uid]), 10_000, mark);
  t.pass('SIGHUP re-read the file');
});

t.test('agent-users file missing: one clear error with the fix; only root (and the service user) are served', needsRoot, async (t) => {
  const agent = ensureAgentUser();
  const file = join(tempDir('ac-agent-users-', t), 'agent-users');
  const { fwd, gw } = await forwarder(t, file);
  const err = await fwd.waitForLog((l) => typeof l.msg === 'string' && l.msg.startsWith('no agent users configured'));
  t.equal(err.level, 'error');
  t.match(err.msg, /agent-connectors install --agent-user NAME/, 'names the fix');
  t.match(err.msg, file, 'names the file');
  assertRefused(t, await asUser(agent, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]), agent, 1, 'no file: even the agent user is refused');
  t.equal(gw.requests.length, 0, 'nothing reached the Gateway');
  t.equal((await fetch(`${fwd.base}/healthz`)).status, 200, 'root is served');

  // Created later: picked up without a restart.
  const mark = fwd.logs.length;
  writeUsers(file, `${agent.name}\n`);
  await fwd.waitForLog(usersLoaded([agent.uid]), 10_000, mark);
  t.equal((await asUser(agent, fwd.port, [['POST', `/i/${BINDING}/mcp`, PING]]))[0]?.status, 200, 'the agent user is served once the file exists');
});

t.test('the peer check is right with 2 000 unrelated loopback sockets open', needsRoot, async (t) => {
  const agent = ensureAgentUser();
  const other = ensureAgentUser('ac-peer-other');
  const file = join(tempDir('ac-agent-users-', t), 'agent-users');
  writeUsers(file, `${agent.name}\n`);
  const { fwd, gw } = await forwarder(t, file);
  await fwd.waitForLog(usersLoaded([agent.uid]));

  // 1 000 connections (2 000 sockets) owned by root, the test's own user.
  const held: Socket[] = [];
  const server = createServer((s) => held.push(s));
  t.teardown(() => {
    for (const s of held) s.destroy();
    server.close();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  for (let i = 0; i < 1000; i += 100) {
    await Promise.all(
      Array.from({ length: 100 }, () => new Promise<void>((resolve, reject) => {
        const c = connect(port, '127.0.0.1', resolve);
        c.on('error', reject);
        held.push(c);
      })),
    );
  }

  const agentAnswers = await asUser(agent, fwd.port, Array.from({ length: 5 }, () => ['POST', `/i/${BINDING}/mcp`, PING] as [string, string, string]));
  t.same(agentAnswers.map((a) => a.status), [200, 200, 200, 200, 200], 'the agent user is served on each new connection');
  assertRefused(t, await asUser(other, fwd.port, Array.from({ length: 5 }, () => ['POST', `/i/${BINDING}/mcp`, PING] as [string, string, string])), other, 5, 'the non-agent user');
  t.equal(gw.requests.length, 5, 'only the agent user\'s calls reached the Gateway');
});

if (isRoot) checkNoLeaks(t);
