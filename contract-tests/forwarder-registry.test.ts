import { mkdirSync, readFileSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { MockGateway } from '../test/support/mock-gateway.js';
import { checkNoLeaks, waitForLogAfter, writeJsonAtomic, writeToken } from '../test/support/cli-proc.js';
import { until } from '../test/support/poll.js';
import { loadConfig as load, startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { assertJsonError, send, type Resp } from './helpers/http-raw.js';

const PACKAGE_VERSION = (
  JSON.parse(readFileSync(fileURLToPath(new URL('../../package.json', import.meta.url)), 'utf8')) as { version: string }
).version;

const A = 'bind_registry_AAAA_01';
const B = 'bind_registry_BBBB_02';

interface Binding {
  instanceId: string;
  upstreamUrl: string;
  tokenFile: string;
}

interface Health {
  resp: Resp;
  body: Record<string, unknown>;
}

async function health(fwd: ProxyProc): Promise<Health> {
  const resp = await send(`${fwd.base}/healthz`, { method: 'GET', headers: {} });
  return { resp, body: JSON.parse(resp.body) as Record<string, unknown> };
}

function mcp(fwd: ProxyProc, id: string): Promise<Resp> {
  return send(`${fwd.base}/i/${id}/mcp`, { body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' });
}

async function world(tt: TapTest): Promise<{ gw: MockGateway; dir: string; a: Binding; b: Binding }> {
  const gw = await MockGateway.start();
  tt.teardown(() => gw.close());
  const dir = tempDir('ac-reg-tokens-', tt);
  const a = { instanceId: 'inst-reg-a', upstreamUrl: gw.url('/mcp-a'), tokenFile: join(dir, 'a.token') };
  const b = { instanceId: 'inst-reg-b', upstreamUrl: gw.url('/mcp-b'), tokenFile: join(dir, 'b.token') };
  writeToken(a.tokenFile, 'tok-registry-a-PPPP');
  writeToken(b.tokenFile, 'tok-registry-b-QQQQ');
  return { gw, dir, a, b };
}

t.test('8. hot reload: added bindings serve, removed ones 404, invalid files keep the last good registry', async (t) => {
  const { gw, a, b } = await world(t);
  const fwd = await startProxy(t, 'forwarder');
  await load(fwd, { [A]: a });
  t.equal((await mcp(fwd, A)).status, 200, 'A serves');
  assertJsonError(t, await mcp(fwd, B), 404, 'unknown_binding', 'B not yet');

  await load(fwd, { [A]: a, [B]: b });
  const rb = await mcp(fwd, B);
  t.equal(rb.status, 200, 'B added without restart serves');
  t.equal(gw.requests.at(-1)?.url, '/mcp-b', "B goes to B's upstream");
  t.equal(gw.requests.at(-1)?.headers.authorization, 'Bearer tok-registry-b-QQQQ', "with B's token");

  await load(fwd, { [B]: b });
  const before = gw.requests.length;
  assertJsonError(t, await mcp(fwd, A), 404, 'unknown_binding', 'removed A');
  t.equal(gw.requests.length, before, 'removed binding: upstream not contacted');
  t.equal((await mcp(fwd, B)).status, 200, 'B still serves');

  const canary = 'canaryCANARY7731';
  const invalid: Array<[string, string]> = [
    ['bad JSON', `{"${B}": {"instanceId": "${canary}", "upstreamUrl": `],
    ['non-loopback http upstream', JSON.stringify({ [B]: { ...b, instanceId: canary, upstreamUrl: `http://example.com/mcp/${canary}` } })],
    ['ftp upstream', JSON.stringify({ [B]: { ...b, instanceId: canary, upstreamUrl: `ftp://127.0.0.1/${canary}` } })],
    ['relative tokenFile', JSON.stringify({ [B]: { ...b, instanceId: canary, tokenFile: `tokens/${canary}.token` } })],
    ['bad bindingId key', JSON.stringify({ [`bad id ${canary}!`]: b, [B]: b })],
    ['short bindingId key', JSON.stringify({ short: b, [B]: b })],
    ['unknown field', JSON.stringify({ [B]: { ...b, extra: canary } })],
    ['not an object', JSON.stringify([canary])],
  ];
  for (const [what, text] of invalid) {
    const mark = fwd.logs.length;
    writeJsonAtomic(fwd.configPath, text);
    const err = await waitForLogAfter(fwd, mark, (l) => l.level === 'error');
    const line = JSON.stringify(err);
    t.notOk(line.includes(canary), `${what}: the error log line does not quote the file`);
    t.notOk(line.includes(B), `${what}: the error log line does not name a full binding id`);
    const h = await health(fwd);
    t.equal(h.body.status, 'degraded', `${what}: /healthz degraded`);
    t.equal(h.body.instances, 1, `${what}: the last good registry (1 binding) stays in force`);
    t.equal((await mcp(fwd, B)).status, 200, `${what}: the last good binding still serves`);
    assertJsonError(t, await mcp(fwd, A), 404, 'unknown_binding', `${what}: the last good registry still excludes A`);
  }

  await load(fwd, { [A]: a });
  const h = await health(fwd);
  t.equal(h.body.status, 'ok', 'a good file afterwards: ok again');
  t.equal(h.body.instances, 1);
  t.equal((await mcp(fwd, A)).status, 200, 'the new good file serves');
  assertJsonError(t, await mcp(fwd, B), 404, 'unknown_binding', 'and B is gone');

  await fwd.stop('SIGTERM');
  const all = fwd.lines.join('\n');
  t.notOk(all.includes(A) || all.includes(B), 'no log line names a binding id in full');
});

t.test('hot reload: a rewrite right after a reload is not lost (bind, then unbind at once)', async (t) => {
  const { gw, a, b } = await world(t);
  const fwd = await startProxy(t, 'forwarder');
  await load(fwd, { [A]: a });
  for (let i = 0; i < 4; i++) {
    // A script binds B, sees it loaded, and immediately unbinds A (or the reverse): two
    // renames into place a few milliseconds apart. The second must not be lost.
    const [keep, drop, first, second] = i % 2 === 0 ? [B, A, { [A]: a, [B]: b }, { [B]: b }] : [A, B, { [A]: a, [B]: b }, { [A]: a }];
    await load(fwd, first);
    writeJsonAtomic(fwd.configPath, second);
    let removed = false;
    await until(async () => (removed = (await mcp(fwd, drop)).status === 404), `round ${i}: the second file is in force`, 3_000).catch(
      (err: Error) => t.fail(err.message),
    );
    t.ok(removed, `round ${i}: the binding removed by the second write answers 404`);
    const before = gw.requests.length;
    t.equal((await mcp(fwd, keep)).status, 200, `round ${i}: the kept binding serves`);
    t.equal(gw.requests.length, before + 1);
    if (!removed) break;
  }
});

t.test('missing instances.json at start: empty registry, the file is loaded when it appears', async (t) => {
  const { a } = await world(t);
  const fwd = await startProxy(t, 'forwarder');
  const h = await health(fwd);
  t.equal(h.resp.status, 200);
  t.same(h.body, { status: 'ok', instances: 0, version: PACKAGE_VERSION }, 'ok with 0 instances');
  assertJsonError(t, await mcp(fwd, A), 404, 'unknown_binding');

  await load(fwd, { [A]: a });
  t.equal((await mcp(fwd, A)).status, 200, 'the file appearing later is loaded');
  t.same((await health(fwd)).body, { status: 'ok', instances: 1, version: PACKAGE_VERSION });
});

t.test('invalid instances.json at start: starts degraded with an empty registry', async (t) => {
  const { a } = await world(t);
  const stateDir = tempDir('ac-test-', t);
  mkdirSync(join(stateDir, 'mcp-forwarder'), { recursive: true, mode: 0o700 });
  const path = join(stateDir, 'mcp-forwarder', 'instances.json');
  writeFileSync(path, JSON.stringify({ [A]: { ...a, upstreamUrl: 'http://example.com/mcp' } }), { mode: 0o600 });
  const fwd = await startProxy(t, 'forwarder', { stateDir });
  const h = await health(fwd);
  t.equal(h.resp.status, 200, '/healthz still answers');
  t.same(h.body, { status: 'degraded', instances: 0, version: PACKAGE_VERSION }, 'degraded, 0 instances');
  assertJsonError(t, await mcp(fwd, A), 404, 'unknown_binding', 'nothing from the invalid file serves');
  t.ok(fwd.logs.some((l) => l.level === 'error'), 'the rejection was logged');

  await load(fwd, { [A]: a }, path);
  t.same((await health(fwd)).body, { status: 'ok', instances: 1, version: PACKAGE_VERSION }, 'a good file: ok');
  t.equal((await mcp(fwd, A)).status, 200);
});

t.test('SIGHUP reloads, re-reading --instances afresh through a re-pointed symlink', async (t) => {
  const { gw, a, b } = await world(t);
  const root = tempDir('ac-reg-hup-', t);
  const dirA = join(root, 'gen-a');
  const dirB = join(root, 'gen-b');
  mkdirSync(dirA);
  mkdirSync(dirB);
  writeJsonAtomic(join(dirA, 'instances.json'), { [A]: a });
  writeJsonAtomic(join(dirB, 'instances.json'), { [B]: b });
  // The symlink is a directory component: re-pointing it changes nothing inside the
  // watched directory, so only the SIGHUP can make the forwarder notice.
  const link = join(root, 'current');
  symlinkSync(dirA, link);
  const fwd = await startProxy(t, 'forwarder', { args: ['--instances', join(link, 'instances.json')] });
  t.equal((await mcp(fwd, A)).status, 200, 'A serves from gen-a');

  const tmpLink = join(root, 'current.tmp');
  symlinkSync(dirB, tmpLink);
  renameSync(tmpLink, link);
  const mark = fwd.logs.length;
  fwd.child.kill('SIGHUP');
  await waitForLogAfter(fwd, mark, (l) => l.msg === 'registry loaded' && l.instances === 1);
  const rb = await mcp(fwd, B);
  t.equal(rb.status, 200, 'after SIGHUP the new file\'s binding serves');
  t.equal(gw.requests.at(-1)?.url, '/mcp-b');
  assertJsonError(t, await mcp(fwd, A), 404, 'unknown_binding', 'the old file\'s binding is gone');
  t.equal(fwd.child.exitCode, null, 'SIGHUP did not stop the process');
  t.same((await health(fwd)).body, { status: 'ok', instances: 1, version: PACKAGE_VERSION });
});

t.test('/healthz: exactly status, instances, version; no ids, no secrets', async (t) => {
  const { a, b } = await world(t);
  const fwd = await startProxy(t, 'forwarder');
  await load(fwd, { [A]: a, [B]: b });
  const h = await health(fwd);
  t.equal(h.resp.status, 200);
  t.match(String(h.resp.headers['content-type']), /^application\/json/);
  t.same(Object.keys(h.body).sort(), ['instances', 'status', 'version'], 'exactly three fields');
  t.same(h.body, { status: 'ok', instances: 2, version: PACKAGE_VERSION }, "version is package.json's");
  for (const secretish of [A, B, A.slice(0, 12), B.slice(0, 12), a.instanceId, b.instanceId, 'tok-registry']) {
    t.notOk(h.resp.text.includes(secretish), `healthz does not mention ${secretish.slice(0, 8)}…`);
  }
});

checkNoLeaks(t);
