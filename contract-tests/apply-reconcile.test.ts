import { once } from 'node:events';
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { filesHolding } from './helpers/host-link-rig.js';
import t from 'tap';
import { checkNoLeaks, knownSecrets, startCli, writeJsonAtomic, writeToken, type CliProc, type LogLine } from '../test/support/cli-proc.js';
import { until, within } from '../test/support/poll.js';
import { MockGateway } from '../test/support/mock-gateway.js';
import { startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { send } from './helpers/http-raw.js';
import { hasSlot, manifestSlots } from './helpers/slots.js';
import { holdStream } from './helpers/held-stream.js';

/**
 * apply's reconcile of `<handoff>/desired-state.json` (SPEC §8), black-box: the built
 * CLI's `renew apply --watch`, a forwarder and a cli-proxy on one state root. The link is
 * played by this test (it writes desired-state.json by rename, as the link does), renewal
 * too (token files written where apply put the token paths).
 */

const B1 = 'bind_reconcile_AAAA_01';
const B2 = 'bind_reconcile_BBBB_02';
const APPLIED = 'desired state applied';
const REJECTED = 'desired state rejected; the last good one stays in force';

interface World {
  state: string;
  handoff: string;
  shimDir: string;
  gw: MockGateway;
  fwd: ProxyProc;
  cli: ProxyProc;
  instanceToken: (id: string) => string;
  providerToken: (name: string) => string;
  writeState: (s: unknown) => void;
  startApply: (env?: NodeJS.ProcessEnv) => Promise<CliProc>;
}

async function world(tt: TapTest): Promise<World> {
  const state = tempDir('ac-reconcile-', tt);
  const handoff = join(state, 'handoff');
  for (const d of ['inbox', 'slots']) mkdirSync(join(handoff, d), { recursive: true });
  const gw = await MockGateway.start();
  tt.teardown(() => gw.close());
  const fwd = await startProxy(tt, 'forwarder', { stateDir: state });
  const cli = await startProxy(tt, 'cli-proxy', { stateDir: state });
  const shimDir = join(state, 'shim-out');
  return {
    state,
    handoff,
    shimDir,
    gw,
    fwd,
    cli,
    instanceToken: (id) => join(state, 'mcp-forwarder', `${id}.token`),
    providerToken: (name) => join(state, 'cli-proxy', `${name}.token`),
    writeState: (s) => writeJsonAtomic(join(handoff, 'desired-state.json'), s),
    startApply: async (env = {}) => {
      const proc = startCli(['renew', 'apply', '--watch', '--state-dir', state, '--shim-dir', shimDir, '--log-level', 'trace'], env);
      tt.teardown(() => proc.stop('SIGKILL'));
      await proc.waitForLog((l) => l.msg === 'apply watching', 10_000);
      return proc;
    },
  };
}

function desired(w: World, version: number, bindings: Record<string, string>, providers: string[]): Record<string, unknown> {
  return {
    version,
    bindings: Object.fromEntries(Object.entries(bindings).map(([id, inst]) => [id, { instanceId: inst, upstreamUrl: w.gw.url(`/mcp/${inst}`) }])),
    providers: Object.fromEntries(
      providers.map((p) => [p, { upstream: w.gw.url(`/api/${p}`), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: `${p}-cli` }] }]),
    ),
  };
}

const appliedLine = (v: number) => (l: LogLine) => l.msg === APPLIED && l.version === v;

function readJson(path: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
}

const mcp = (w: World, id: string) => send(`${w.fwd.base}/i/${id}/mcp`, { body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' });
const api = (w: World, p: string) => send(`${w.cli.base}/p/${p}/user`, { method: 'GET', headers: {} });

/** Applies v1 (B1 → inst-a, provider `rec`) and writes its tokens as renewal would. */
async function applyFirst(t: TapTest, w: World, apply: CliProc): Promise<{ tokA: string; tokRec: string }> {
  const fwdMark = w.fwd.logs.length;
  const cliMark = w.cli.logs.length;
  w.writeState(desired(w, 1, { [B1]: 'inst-a' }, ['rec']));
  await apply.waitForLog(appliedLine(1));
  // One manifest names the new slots; no per-slot file until a slot holds a token.
  t.same(manifestSlots(w.handoff), ['cli:rec', 'instance:inst-a'], 'the manifest names the new instance\'s and provider\'s slots');
  t.notOk(existsSync(join(w.handoff, 'slots', 'instance:inst-a.json')), 'no per-slot file for a slot without a token');
  t.equal(statSync(join(w.state, 'mcp-forwarder', 'instances.json')).mode & 0o777, 0o600, 'instances.json 0600');
  t.equal(statSync(join(w.state, 'cli-proxy', 'providers.json')).mode & 0o777, 0o600, 'providers.json 0600');
  t.ok(existsSync(join(w.shimDir, 'rec-cli')), 'shim rendered into --shim-dir');
  const tokA = `tok-reconcile-a-${Date.now()}-XYZW`;
  const tokRec = `tok-reconcile-rec-${Date.now()}-QRST`;
  knownSecrets.add(tokA).add(tokRec);
  writeToken(w.instanceToken('inst-a'), tokA);
  writeToken(w.providerToken('rec'), tokRec);
  await w.fwd.waitForLog((l) => l.msg === 'registry loaded' && l.instances === 1, 10_000, fwdMark);
  await w.cli.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1, 10_000, cliMark);
  return { tokA, tokRec };
}

t.test('a desired state makes the forwarder serve the binding and the cli-proxy the provider; dropping them deletes the tokens and 404s within 2 s, in-flight SSE intact', async (t) => {
  const w = await world(t);
  const apply = await w.startApply();
  const { tokA, tokRec } = await applyFirst(t, w, apply);

  const r1 = await mcp(w, B1);
  t.equal(r1.status, 200, 'forwarder serves the new binding');
  t.equal(w.gw.requests.at(-1)?.headers.authorization, `Bearer ${tokA}`, 'with the binding token');
  const r2 = await api(w, 'rec');
  t.equal(r2.status, 200, 'cli-proxy serves the new provider');
  t.equal(w.gw.requests.at(-1)?.headers.authorization, `Bearer ${tokRec}`, 'with the provider token');

  // An SSE stream through B1, open across the drop.
  const { reader, stream, first: ev1 } = await holdStream(w.gw, `${w.fwd.base}/i/${B1}/mcp`);

  const t0 = Date.now();
  w.writeState(desired(w, 2, {}, []));
  await until(async () => !existsSync(w.instanceToken('inst-a')) && !existsSync(w.providerToken('rec')), 'token files deleted', 5_000);
  const deletedMs = Date.now() - t0;
  await until(async () => (await mcp(w, B1)).status === 404 && (await api(w, 'rec')).status === 404, 'both proxies answer 404', 5_000);
  const notFoundMs = Date.now() - t0;
  t.comment(`drop → token files deleted: ${deletedMs} ms; → forwarder and cli-proxy 404: ${notFoundMs} ms`);
  t.ok(notFoundMs <= 2_000, `dropped binding/provider gone within 2 s (${notFoundMs} ms)`);
  await apply.waitForLog(appliedLine(2));

  const ev2 = 'event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{}}\n\n';
  stream.send(ev2);
  stream.end();
  t.same(await reader.ended, { kind: 'end' }, 'the in-flight stream ended cleanly');
  t.equal(reader.text(), ev1 + ev2, 'every event arrived whole: not cut mid-event');

  t.notOk(hasSlot(w.handoff, 'instance:inst-a'), 'binding slot retired (file and manifest entry)');
  t.notOk(hasSlot(w.handoff, 'cli:rec'), 'provider slot retired');
  t.notOk(existsSync(join(w.shimDir, 'rec-cli')), 'its shim removed');
  const holding = filesHolding(w.state, [tokA, tokRec]);
  t.same(holding, [], 'no file under the state root (hand-off included) holds an old token');
  t.match(readJson(join(w.handoff, 'applied-state.json')), { version: 2, appliedAt: String });

  checkNoLeaks(t);
});

t.test('a state with one bad entry is rejected whole; the last good one keeps serving; applied-state says rejected', async (t) => {
  const w = await world(t);
  const apply = await w.startApply();
  await applyFirst(t, w, apply);
  const registry = readFileSync(join(w.state, 'mcp-forwarder', 'instances.json'), 'utf8');
  const catalog = readFileSync(join(w.state, 'cli-proxy', 'providers.json'), 'utf8');

  const httpUpstream = desired(w, 2, { [B1]: 'inst-a', [B2]: 'inst-b' }, ['rec']);
  (httpUpstream.bindings as Record<string, { upstreamUrl: string }>)[B2]!.upstreamUrl = 'http://gateway.example.com/mcp';
  const reservedHeader = desired(w, 3, { [B1]: 'inst-a' }, ['rec', 'other']);
  (reservedHeader.providers as Record<string, { inject: unknown }>).other!.inject = { type: 'header', name: 'Host', value: '{token}' };
  const dotdot = desired(w, 4, { [B1]: 'inst-a', [B2]: '../escape' }, ['rec']);
  for (const [bad, what] of [
    [httpUpstream, 'an http:// upstream'],
    [reservedHeader, 'a reserved header'],
    [dotdot, 'a ../ name'],
  ] as const) {
    const mark = apply.logs.length;
    w.writeState(bad);
    const line = await apply.waitForLog((l) => l.msg === REJECTED, 10_000, mark);
    t.equal(line.version, bad.version, `${what}: rejected, logged with its version`);
    t.notOk(JSON.stringify(line).includes('gateway.example.com'), `${what}: the log names no value`);
    t.match(readJson(join(w.handoff, 'applied-state.json')), { version: 1, rejected: { version: bad.version, error: String } }, `${what}: applied-state says rejected`);
    t.equal(readFileSync(join(w.state, 'mcp-forwarder', 'instances.json'), 'utf8'), registry, `${what}: registry kept`);
    t.equal(readFileSync(join(w.state, 'cli-proxy', 'providers.json'), 'utf8'), catalog, `${what}: catalog kept`);
  }
  t.notOk(hasSlot(w.handoff, 'instance:inst-b'), 'no slot for a rejected state');
  t.equal((await mcp(w, B1)).status, 200, 'the last good binding still serves');
  t.equal((await api(w, 'rec')).status, 200, 'the last good provider still serves');
  checkNoLeaks(t);
});

t.test('apply SIGKILLed right after writing the registry converges after a restart', async (t) => {
  const w = await world(t);
  const first = await w.startApply();
  const { tokA } = await applyFirst(t, w, first);
  await first.stop('SIGTERM');

  const crashing = await w.startApply({ AGENT_CONNECTORS_TEST_HOOKS: 'crash:reconcile-after-registry-write' });
  w.writeState(desired(w, 2, { [B2]: 'inst-b' }, ['rec']));
  const exit = await within(crashing.exited, 10_000, 'apply to be killed at the crash point');
  t.equal(exit.signal, 'SIGKILL', 'killed at the crash point');
  t.ok(Object.hasOwn(readJson(join(w.state, 'mcp-forwarder', 'instances.json')), B2), 'the registry was written');
  // The registry goes first (the state in force sooner); the new binding's slot file follows it.
  t.notOk(hasSlot(w.handoff, 'instance:inst-b'), 'the new slot not yet in the manifest');
  t.ok(hasSlot(w.handoff, 'instance:inst-a'), 'the dropped binding\'s slot still there (the reminder)');
  t.ok(existsSync(w.instanceToken('inst-a')), 'the dropped binding\'s token not yet deleted');
  t.match(readJson(join(w.handoff, 'applied-state.json')), { version: 1 }, 'version 2 not in force');

  const again = await w.startApply();
  await again.waitForLog(appliedLine(2));
  t.notOk(existsSync(w.instanceToken('inst-a')), 'the dropped binding\'s token deleted after the restart');
  t.notOk(hasSlot(w.handoff, 'instance:inst-a'), 'its slot retired');
  t.ok(hasSlot(w.handoff, 'instance:inst-b'), 'the new slot exists');
  t.same(Object.keys(readJson(join(w.state, 'mcp-forwarder', 'instances.json'))), [B2]);
  t.match(readJson(join(w.handoff, 'applied-state.json')), { version: 2 });
  // apply's lock file comes and goes while the tree is read: filesHolding skips what vanished.
  t.same(filesHolding(w.state, [tokA]), [], 'no old token left');
  checkNoLeaks(t);
});

t.test('bind and unbind are refused on an enrolled host: exit 2, naming the Gateway', async (t) => {
  const state = tempDir('ac-managed-', t);
  const etc = join(state, 'etc');
  mkdirSync(etc, { recursive: true });
  const credential = join(etc, 'host-credential');
  writeFileSync(credential, 'hc-secret-not-read\n', { mode: 0o600 });
  writeFileSync(join(etc, 'link.env'), 'AGENT_CONNECTORS_GATEWAY_URL=https://gw.managed.example\nAGENT_CONNECTORS_HOST_ID=h1\n');
  const run = async (args: string[], cred = credential): Promise<{ code: number | null; out: string }> => {
    const proc = startCli([...args, '--state-dir', state, '--credential', cred]);
    const [code] = (await once(proc.child, 'close')) as [number | null];
    return { code, out: proc.lines.join('\n') };
  };
  const bind = await run(['bind', B1, '--instance-id', 'inst-x', '--upstream', 'https://gw.managed.example/mcp']);
  t.equal(bind.code, 2, 'bind exits 2');
  t.match(bind.out, /https:\/\/gw\.managed\.example/, 'bind names the Gateway');
  t.notOk(existsSync(join(state, 'mcp-forwarder', 'instances.json')), 'nothing written');
  const unbind = await run(['unbind', B1]);
  t.equal(unbind.code, 2, 'unbind exits 2');
  t.match(unbind.out, /https:\/\/gw\.managed\.example/, 'unbind names the Gateway');

  const free = join(state, 'not-enrolled', 'host-credential');
  const ok = await run(['bind', B1, '--instance-id', 'inst-x', '--upstream', 'https://gw.managed.example/mcp'], free);
  t.equal(ok.code, 0, 'a host never enrolled binds as before');
  const tokenFile = join(state, 'mcp-forwarder', 'inst-x.token');
  writeToken(tokenFile, 'tok-managed-unbind-LMNO');
  knownSecrets.add('tok-managed-unbind-LMNO');
  const un = await run(['unbind', B1], free);
  t.equal(un.code, 0, 'and unbinds');
  t.notOk(existsSync(tokenFile), 'unbind of the instance\'s last binding deleted its token file');
});

t.test('a new desired state is applied ahead of a long inbox: the pass over hand-offs yields to it', async (t) => {
  const w = await world(t);
  const apply = await w.startApply();
  const N = 300;
  const ids = Array.from({ length: N }, (_v, i) => [`bind_yield_${String(i).padStart(4, '0')}_AAAAAAAA`, `inst-y${i}`] as const);
  w.writeState(desired(w, 1, Object.fromEntries(ids), []));
  await apply.waitForLog(appliedLine(1), 60_000);
  // The inbox filled while apply is stopped, so its next pass is long; the new state
  // (dropping the first binding) arrives once that pass has begun.
  const pid = apply.child.pid as number;
  process.kill(pid, 'SIGSTOP');
  const expiresAt = new Date(Date.now() + 3_600_000).toISOString();
  for (const [, inst] of ids) {
    const token = `tok-yield-${inst}-${Date.now()}-QWER`;
    knownSecrets.add(token);
    writeJsonAtomic(join(w.handoff, 'inbox', `instance:${inst}.json`), { slot: `instance:${inst}`, tokenId: `tid-${inst}`, token, expiresAt, credentialGeneration: 0 });
  }
  const mark = apply.logs.length;
  process.kill(pid, 'SIGCONT');
  await apply.waitForLog((l) => l.msg === 'token applied', 30_000, mark);
  const [dropped] = ids;
  w.writeState(desired(w, 2, Object.fromEntries(ids.slice(1)), []));
  await apply.waitForLog(appliedLine(2), 60_000, mark);
  const at = apply.logs.findIndex((l, i) => i >= mark && appliedLine(2)(l));
  const before = apply.logs.slice(mark, at).filter((l) => l.msg === 'token applied').length;
  t.ok(before < N / 2, `version 2 applied after ${before} of the ${N} hand-offs, not behind the whole pass`);
  t.notOk(existsSync(w.instanceToken(dropped?.[1] ?? '')), "the dropped binding's token file is gone");
  // The rest of the inbox still goes through.
  await until(() => apply.logs.slice(mark).filter((l) => l.msg === 'token applied').length >= N - 1, 'every other hand-off applied', 60_000);
  t.pass('every other hand-off applied after the state');
  checkNoLeaks(t);
});
