import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { allProcs, CLI, CliProc, knownSecrets, type LogLine } from '../test/support/cli-proc.js';
import { MockGateway } from '../test/support/mock-gateway.js';
import { until, within } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { send } from './helpers/http-raw.js';
import { handoffSlots } from './helpers/slots.js';
import { appliedLine, enroll, filesHolding, hostWorld, parseEnvFile, readJson, type HostWorld } from './helpers/host-link-rig.js';

/*
 * Issue 21 item 8: when access ends for the whole host, the credentials go. Black box:
 * the built CLI's link, apply, forwarder and cli-proxy against the mock host Gateway, with
 * a loopback SaaS behind both proxies. Two ways access ends: the Gateway answers the
 * link's credential with 401 (the host removed in the platform), and `unenroll`. After
 * each: no token file, no shim, no slot, the forwarder 404, the cli-proxy 404 (or 503 for
 * the moment before it reloads), no request reaches the SaaS any more, and the link sends
 * the Gateway nothing more. A new enrolment's first state brings everything back.
 * Before the change: only the credential went; tokens, shims and routes stayed and both
 * proxies kept injecting tokens. The times printed are figures, not assertions.
 */

const BINDING = 'bind_revoke_0001';
const PROVIDER = 'revokecli';
const INSTANCE = 'inst-revoke';

const world: HostWorld = await hostWorld(t, { proxies: true, tokenLifetimeMs: 120_000 });
const saas = await MockGateway.start();
t.teardown(() => saas.close());
const fwd = world.fwd!;
const cliProxy = world.cli!;
const agentUsers = join(world.root, 'agent-users');
writeFileSync(agentUsers, '# nobody yet\n');

const mcpPost = () => send(`${fwd.base}/i/${BINDING}/mcp`, { body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' });
const apiGet = () => send(`${cliProxy.base}/p/${PROVIDER}/user`, { method: 'GET', headers: {} });
const shim = join(world.shimDir, `${PROVIDER}-cli`);
const allMinted = (): string[] => [...world.minted.values()].flatMap((s) => [...s]);

const apply = world.startApply();
await apply.waitForLog((l) => l.msg === 'apply watching', 15_000);
let link = world.startLink({}, 'unit', ['--agent-users-file', agentUsers]);

world.gw.control.connectBinding(BINDING, { instanceId: INSTANCE, upstreamUrl: saas.url('/mcp/revoke') });
world.gw.control.connectProvider(PROVIDER, {
  upstream: saas.url(`/api/${PROVIDER}`),
  inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
  commands: [{ name: `${PROVIDER}-cli`, env: {} }],
});

async function serving(what: string): Promise<void> {
  await apply.waitForLog(appliedLine(world.gw.control.version), 20_000, 0);
  await until(async () => (await mcpPost()).status === 200 && (await apiGet()).status === 200, `${what}: both proxies serving`, 20_000);
}

async function runCli(args: string[], stdin = ''): Promise<CliProc> {
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, CLI, ...args], {
    env: { ...process.env, NOTIFY_SOCKET: '', AGENT_CONNECTORS_TEST_HOOKS: 'systemd:absent' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const proc = new CliProc(child);
  allProcs.push(proc);
  child.stdin.end(stdin);
  const exit = await within(proc.exited, 30_000, args[0] ?? 'cli');
  if (exit.code !== 0) throw new Error(`${args[0]} failed (${exit.code ?? exit.signal}):\n${proc.lines.join('\n')}`);
  return proc;
}

/** Requests on both routes, back to back, until `stop`; every status kept in order. */
function flow(): { statuses: { fwd: number[]; cli: number[] }; stop: () => Promise<void> } {
  const statuses = { fwd: [] as number[], cli: [] as number[] };
  let on = true;
  const running = (async () => {
    while (on) {
      const [a, b] = await Promise.all([mcpPost(), apiGet()]);
      statuses.fwd.push(a.status);
      statuses.cli.push(b.status);
    }
  })();
  return {
    statuses,
    stop: async () => {
      on = false;
      await running;
    },
  };
}

/** Served, then 503 for a moment at most, then 404 for good. */
function endsIn404(list: number[]): boolean {
  const rank = (s: number) => (s === 200 ? 0 : s === 503 ? 1 : s === 404 ? 2 : -1);
  return list.at(-1) === 404 && list.every((s, i) => rank(s) >= 0 && (i === 0 || rank(s) >= rank(list[i - 1] as number)));
}

const revokedLine = (l: LogLine) => l.msg?.startsWith('host access revoked') === true;

/** Waits for the revocation to be in force, times what the agent side sees, then checks nothing of the old access is left. */
async function checkRevoked(tt: TapTest, how: string, revoke: () => Promise<void>): Promise<void> {
  const tokenFiles = [world.instanceToken(INSTANCE), world.providerToken(PROVIDER)];
  for (const f of tokenFiles) tt.ok(existsSync(f), `before: ${f} exists`);
  tt.ok(existsSync(shim), 'before: the shim exists');
  const traffic = flow();
  await until(() => traffic.statuses.fwd.length >= 3, 'requests flowing');
  const mark = apply.logs.length;
  const t0 = Date.now();
  const figures: Record<string, number> = {};
  const at = (name: string) => (figures[name] ??= Date.now() - t0);
  // Timed while the revocation runs (unenroll returns only once apply has acted).
  const revoking = revoke();
  await until(() => {
    if (!tokenFiles.some((f) => existsSync(f))) at('tokenFilesGone');
    if (!existsSync(shim)) at('shimGone');
    if (traffic.statuses.fwd.at(-1) === 404) at('forwarder404');
    if (traffic.statuses.cli.at(-1) === 404) at('cliProxy404');
    return Object.keys(figures).length === 4;
  }, `${how}: token files and shim gone, both proxies 404`, 20_000);
  await revoking;
  await apply.waitForLog(revokedLine, 20_000, mark);
  // The SaaS is no longer reached: every request from here on stops at the proxies.
  const saasSeen = saas.requests.length;
  const gatewaySeen = world.gw.requests.length;
  const settled = traffic.statuses.fwd.length;
  await until(() => traffic.statuses.fwd.length >= settled + 20, 'twenty more requests on each route');
  await traffic.stop();
  tt.equal(saas.requests.length, saasSeen, `${how}: no request reached the SaaS after the revocation (${saasSeen} before)`);
  tt.equal(world.gw.requests.length, gatewaySeen, `${how}: the link sends the Gateway nothing more`);
  tt.ok(endsIn404(traffic.statuses.fwd), `${how}: forwarder 200 → (503) → 404 for good (${[...new Set(traffic.statuses.fwd)].join(' → ')})`);
  tt.ok(endsIn404(traffic.statuses.cli), `${how}: cli-proxy 200 → (503) → 404 for good (${[...new Set(traffic.statuses.cli)].join(' → ')})`);
  for (const f of tokenFiles) tt.notOk(existsSync(f), `${how}: ${f} deleted`);
  tt.same(readdirSync(world.shimDir).filter((n) => !n.startsWith('.')), [], `${how}: no shim left`);
  tt.same(handoffSlots(world.handoff), [], `${how}: every slot retired (files and manifest)`);
  tt.same(readdirSync(join(world.handoff, 'inbox')).filter((n) => n.endsWith('.json')), [], `${how}: nothing waiting in the inbox`);
  tt.same(readJson(join(world.applyState, 'mcp-forwarder', 'instances.json')), {}, `${how}: registry empty`);
  tt.same(readJson(join(world.applyState, 'cli-proxy', 'providers.json')), {}, `${how}: catalog empty`);
  tt.match(readJson(join(world.handoff, 'applied-state.json')), { version: 0, hostRevoked: {} }, `${how}: applied-state says revoked, version 0`);
  tt.notOk(existsSync(join(world.handoff, 'desired-state.json')), `${how}: the revoked enrolment's desired state is gone`);
  tt.same(filesHolding(world.root, allMinted()), [], `${how}: no file under the host's roots holds a token`);
  tt.comment(`${how} → token files deleted ${figures.tokenFilesGone} ms, shim deleted ${figures.shimGone} ms, forwarder 404 ${figures.forwarder404} ms, cli-proxy 404 ${figures.cliProxy404} ms`);
  // From the revocation handed to apply (the marker's time) rather than from the trigger.
  const handed = Date.parse((readJson(join(world.handoff, 'applied-state.json')).hostRevoked as { at: string }).at) - t0;
  tt.comment(`${how}, from the marker written (+${handed} ms) → token files deleted ${figures.tokenFilesGone! - handed} ms, forwarder 404 ${figures.forwarder404! - handed} ms, cli-proxy 404 ${figures.cliProxy404! - handed} ms`);
}

/** `enroll --force` with a new pairing code, then the link restarted as enroll restarts its unit; everything comes back. */
async function enrolAgain(tt: TapTest, how: string): Promise<void> {
  await link.stop('SIGTERM');
  const code = world.gw.control.issuePairingCode();
  knownSecrets.add(code);
  const run = await enroll(world.gw, world.credential, code, ['--force', '--handoff', world.handoff]);
  knownSecrets.add(readFileSync(world.credential, 'utf8').trim());
  tt.ok(run.lines.some((l) => l.includes('revocation is lifted')), `${how}: enroll lifts the revocation`);
  tt.notOk(existsSync(join(world.handoff, 'host-revoked.json')), `${how}: no marker left`);
  link = world.startLink(parseEnvFile(join(world.root, 'etc', 'link.env')), 'unit', ['--agent-users-file', agentUsers]);
  await serving(`${how}, enrolled again`).catch((err: unknown) => {
    writeFileSync('/tmp/c4-debug.log', [...link.lines, '-----', ...apply.lines.slice(-80)].join('\n'));
    throw err;
  });
  for (const f of [world.instanceToken(INSTANCE), world.providerToken(PROVIDER)]) tt.ok(existsSync(f), `${how}: ${f} back`);
  tt.ok(existsSync(shim), `${how}: the shim back`);
}

t.test('presence: an agent-users file naming nobody is a problem, and stops being one when it names someone', async (tt) => {
  await serving('first enrolment');
  await until(() => world.gw.control.presences.some((p) => p.body.problems.includes('agent_users_empty')), 'presence reports agent_users_empty', 20_000);
  const seen = world.gw.control.presences.length;
  writeFileSync(agentUsers, 'nobody\n');
  await until(
    () => world.gw.control.presences.slice(seen).some((p) => p.body.stateVersion !== null && !p.body.problems.includes('agent_users_empty')),
    'a later presence without agent_users_empty',
    20_000,
  );
  tt.pass('presence follows the file');
});

t.test('the Gateway answers the host credential with 401: everything goes at once, the link stops, a new enrolment brings it back', async (tt) => {
  await serving('before the 401');
  const linkMark = link.logs.length;
  await checkRevoked(tt, '401', async () => {
    world.gw.control.revokeHost(world.linkEnv.AGENT_CONNECTORS_HOST_ID as string);
  });
  await link.waitForLog((l) => /rejected by the Gateway \(401\)/.test(l.msg ?? ''), 5_000, linkMark);
  await enrolAgain(tt, '401');
});

t.test('unenroll (the link stopped first, as systemd does): everything goes at once; a new enrolment brings it back', async (tt) => {
  await serving('before unenroll');
  await link.stop('SIGTERM');
  await checkRevoked(tt, 'unenroll', async () => {
    const run = await runCli(['unenroll', '--credential', world.credential, '--handoff', world.handoff]);
    tt.ok(run.lines.some((l) => l.includes('apply deleted every token file and shim')), 'unenroll reports what apply did');
  });
  tt.notOk(existsSync(world.credential), 'the credential is gone');
  await enrolAgain(tt, 'unenroll');
});

t.test('the Gateway revokes the host while hundreds of new bindings renew: the revocation wins, no token is left', async (tt) => {
  await serving('before the burst');
  const N = 300;
  const burst = Object.fromEntries(
    Array.from({ length: N }, (_v, i) => [`bind_burst_${String(i).padStart(4, '0')}`, { instanceId: `inst-burst-${i}`, upstreamUrl: saas.url(`/mcp/burst/${i}`) }]),
  );
  const burstTokens = (): number => readdirSync(join(world.applyState, 'mcp-forwarder')).filter((n) => n.startsWith('inst-burst-') && n.endsWith('.token')).length;
  world.gw.control.connectBindings(burst);
  // Revoked as soon as the first new tokens land: renewals and hand-offs are in flight.
  await until(() => burstTokens() >= 10, 'the burst under way', 60_000);
  tt.comment(`revoked with ${burstTokens()} of ${N} new tokens written`);
  const hostId = parseEnvFile(join(world.root, 'etc', 'link.env')).AGENT_CONNECTORS_HOST_ID as string;
  const linkMark = link.logs.length;
  await checkRevoked(tt, '401 during a renewal burst', async () => {
    world.gw.control.revokeHost(hostId);
  });
  await link.waitForLog((l) => /rejected by the Gateway \(401\)/.test(l.msg ?? ''), 5_000, linkMark);
  tt.equal(burstTokens(), 0, 'no token file of the burst is left');
});
