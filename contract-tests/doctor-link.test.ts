import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { doctorReportSchema, type DoctorCheck, type DoctorReport } from '../src/data/doctor-report.js';
import { hostStatusSchema, type HostStatus } from '../src/data/host-status.js';
import { linkStatusSchema, type LinkStatus } from '../src/data/link-status.js';
import { checkNoLeaks, knownSecrets, leakedSecrets, startCli, writeJsonAtomic, writeToken, type CliProc } from '../test/support/cli-proc.js';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { until } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';

/*
 * `doctor` on an enrolled host, black-box: the built CLI's `link` against a
 * MockHostGateway and `renew apply --watch` on one temp state root, then `doctor --json`
 * (validated against its schema) and the text output. Enrolled-but-halted (401), in sync,
 * drift after a hand edit (and the fix doctor names), a rejected state, and a host never
 * enrolled whose report has none of it. No token or credential in any output.
 */

// About thirty CLI processes (link, apply, doctor, status), each a Node start: seconds
// apiece on the shared 2-core VM during a full run, so the file's budget is above tap's 180 s.
t.setTimeout(480_000);

const HOST = 'host-doctor-1';
const B1 = 'bind_doctor_link_AAAA_01';
const B2 = 'bind_doctor_link_BBBB_02';
const NO_PART = 'http://127.0.0.1:9';
const LINK_CHECKS = ['enrolment', 'link', 'desired state', 'drift'];

interface Host {
  base: string;
  state: string;
  handoff: string;
  credentialPath: string;
  instances: string;
  providers: string;
}

function host(tt: TapTest): Host {
  const base = tempDir('ac-doctor-link-', tt);
  const state = join(base, 'state');
  const handoff = join(state, 'handoff');
  for (const d of ['inbox', 'slots']) mkdirSync(join(handoff, d), { recursive: true });
  mkdirSync(join(base, 'etc'));
  return {
    base,
    state,
    handoff,
    credentialPath: join(base, 'etc', 'host-credential'),
    instances: join(state, 'mcp-forwarder', 'instances.json'),
    providers: join(state, 'cli-proxy', 'providers.json'),
  };
}

/** What `enroll` leaves: the credential (0600) and link.env beside it. */
function enrolled(h: Host, gatewayUrl: string, credential: string): void {
  writeToken(h.credentialPath, credential);
  writeFileSync(join(h.base, 'etc', 'link.env'), `AGENT_CONNECTORS_GATEWAY_URL=${gatewayUrl}\nAGENT_CONNECTORS_HOST_ID=${HOST}\n`, { mode: 0o644 });
}

/** A Gateway that knows `credential` as HOST's, and the host enrolled with it. */
async function enrolledWith(tt: TapTest, h: Host, credential: string): Promise<MockHostGateway> {
  knownSecrets.add(credential);
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { [HOST]: credential } });
  tt.teardown(() => gw.close());
  enrolled(h, gw.url, credential);
  return gw;
}

function startLink(tt: TapTest, h: Host, gatewayUrl: string): CliProc {
  const proc = startCli([
    'link',
    '--gateway', gatewayUrl,
    '--credential', h.credentialPath,
    '--handoff', h.handoff,
    '--state-dir', h.state,
    '--host-id', HOST,
    '--link-backoff-base-ms', '50',
    '--link-backoff-cap-ms', '200',
    '--poll-timeout-ms', '3000',
    '--credential-recheck-ms', '200',
    '--forwarder-health', `${NO_PART}/healthz`,
    '--cli-proxy-health', `${NO_PART}/healthz`,
    '--log-level', 'debug',
  ]);
  tt.teardown(() => proc.stop());
  return proc;
}

async function startApply(tt: TapTest, h: Host): Promise<CliProc> {
  const proc = startCli(['renew', 'apply', '--watch', '--state-dir', h.state, '--shim-dir', join(h.base, 'shims'), '--log-level', 'debug']);
  tt.teardown(() => proc.stop('SIGKILL'));
  await proc.waitForLog((l) => l.msg === 'apply watching', 20_000);
  return proc;
}

interface DoctorRun {
  code: number | null;
  text: string;
  report?: DoctorReport;
}

async function doctor(h: Host, json = true): Promise<DoctorRun> {
  const proc = startCli([
    'doctor',
    '--state-dir', h.state,
    '--credential', h.credentialPath,
    '--no-systemd',
    '--forwarder-url', NO_PART,
    '--cli-proxy-url', NO_PART,
    ...(json ? ['--json'] : []),
  ]);
  const exit = await proc.exited;
  const text = proc.lines.join('\n');
  return { code: exit.code, text, ...(json ? { report: doctorReportSchema.parse(JSON.parse(text)) } : {}) };
}

/** A part whose /healthz says ok, as the forwarder's does. */
async function healthyPart(tt: TapTest): Promise<string> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ status: 'ok' }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  tt.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function status(h: Host, forwarderUrl: string, json = true): Promise<{ code: number | null; text: string; status?: HostStatus }> {
  const proc = startCli(['status', '--state-dir', h.state, '--credential', h.credentialPath, '--no-systemd', '--forwarder-url', forwarderUrl, '--cli-proxy-url', NO_PART, ...(json ? ['--json'] : [])]);
  const exit = await proc.exited;
  const text = proc.lines.join('\n');
  return { code: exit.code, text, ...(json ? { status: hostStatusSchema.parse(JSON.parse(text)) } : {}) };
}

function checksOf(run: DoctorRun, check: string): DoctorCheck[] {
  return run.report?.checks.filter((c) => c.check === check) ?? [];
}

function one(tt: TapTest, run: DoctorRun, check: string): DoctorCheck | undefined {
  const found = checksOf(run, check);
  tt.equal(found.length, 1, `one ${check} check (got ${JSON.stringify(found)})`);
  return found[0];
}

function linkStatus(h: Host): LinkStatus | undefined {
  try {
    return linkStatusSchema.parse(JSON.parse(readFileSync(join(h.handoff, 'link-status.json'), 'utf8')));
  } catch {
    return undefined;
  }
}

const appliedVersion = (h: Host): number | undefined => {
  try {
    const a = JSON.parse(readFileSync(join(h.handoff, 'applied-state.json'), 'utf8')) as { version: number; appliedAt: string | null };
    return a.appliedAt ? a.version : undefined;
  } catch {
    return undefined;
  }
};

const PROVIDER = { upstream: 'https://api.example.com', inject: { type: 'header' as const, name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: 'notes-cli', env: {} }] };

t.test('never enrolled: no enrolment, link, version or drift check; the report says enrolled false', async (tt) => {
  const h = host(tt);
  // A desired state left behind (an unenrolled host) changes nothing: no credential, not managed.
  writeJsonAtomic(join(h.handoff, 'desired-state.json'), { version: 3, bindings: {}, providers: {} });
  const run = await doctor(h);
  tt.same(run.report?.enrolment, { enrolled: false });
  for (const c of LINK_CHECKS) tt.same(checksOf(run, c), [], `no ${c} check`);
  tt.equal(run.report?.summary.exitCode, run.code, 'summary.exitCode is the exit code');
  const text = await doctor(h, false);
  tt.equal(text.code, run.code, 'same exit code as --json');
  tt.notMatch(text.text, /enrolment:|link:|drift:|desired state:/, 'the text has no link lines');
});

t.test('enrolled, link halted on 401: doctor says so and names the re-enrol command', async (tt) => {
  const h = host(tt);
  const good = `hostcred-good-${randomUUID()}`;
  const refused = `hostcred-refused-${randomUUID()}`;
  knownSecrets.add(good).add(refused);
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { [HOST]: good } });
  tt.teardown(() => gw.close());
  enrolled(h, gw.url, refused);
  const link = startLink(tt, h, gw.url);
  await link.waitForLog((l) => typeof l.msg === 'string' && l.msg.startsWith('host credential rejected by the Gateway (401)'), 20_000);
  await until(() => linkStatus(h)?.state === 'halted', 'link-status.json says halted', 20_000);
  tt.equal(linkStatus(h)?.lastError?.code, 'credential_rejected');
  tt.equal(linkStatus(h)?.pid, link.child.pid, 'the status names the link process');

  const run = await doctor(h);
  tt.equal(run.code, 1, 'exit 1');
  tt.same(run.report?.enrolment, { enrolled: true, gatewayUrl: gw.url, hostId: HOST });
  tt.equal(one(tt, run, 'enrolment')?.status, 'ok');
  const l = one(tt, run, 'link');
  tt.equal(l?.status, 'problem');
  tt.equal(l?.code, 'link_halted');
  tt.match(l?.detail ?? '', /401/);
  tt.equal(l?.fix, `agent-connectors enroll --gateway ${gw.url} --force`);
  tt.ok(run.report?.summary.problems.includes('link_halted'), 'in the summary');
  tt.equal(one(tt, run, 'desired state')?.code, 'state_not_received', 'nothing received while halted');

  const text = await doctor(h, false);
  tt.match(text.text, new RegExp(`FAIL  link: halted on 401 .*Re-enrol with agent-connectors enroll --gateway ${gw.url.replace(/[.]/g, '\\.')} --force`));
  tt.same(leakedSecrets(run.text + text.text), [], 'no credential in the output');
});

t.test('enrolled and in sync: link polling, version in force, no drift; a hand edit is drift (file and entries named) until apply writes it again', async (tt) => {
  const h = host(tt);
  const gw = await enrolledWith(tt, h, `hostcred-sync-${randomUUID()}`);
  gw.control.connectBinding(B1, { instanceId: 'inst-a', upstreamUrl: 'https://gw.example.com/mcp/a' });
  gw.control.connectProvider('notes', PROVIDER);
  const version = gw.control.state().version;
  let apply = await startApply(tt, h);
  startLink(tt, h, gw.url);
  await until(() => appliedVersion(h) === version, `version ${version} applied`, 30_000);
  await until(() => linkStatus(h)?.lastSyncAt != null && linkStatus(h)?.state === 'polling', 'the link has synced', 20_000);
  const token = `tok-doctor-link-a-${randomUUID()}`;
  writeToken(join(h.state, 'mcp-forwarder', 'inst-a.token'), token);

  const clean = await doctor(h);
  tt.equal(one(tt, clean, 'link')?.status, 'ok');
  tt.match(one(tt, clean, 'link')?.detail ?? '', /^polling .*last sync /);
  const ds = one(tt, clean, 'desired state');
  tt.equal(ds?.status, 'ok');
  tt.match(ds?.detail ?? '', new RegExp(`^version ${version} in force since .*; received ${version}$`));
  tt.equal(one(tt, clean, 'drift')?.status, 'ok', `no drift (got ${JSON.stringify(checksOf(clean, 'drift'))})`);
  for (const c of LINK_CHECKS) tt.notOk(clean.report?.summary.problems.some((p) => checksOf(clean, c).some((x) => x.code === p)), `${c}: no problem`);

  // status: the same host at a glance, once the link has renewed the binding's slot.
  const slotFile = join(h.handoff, 'slots', 'instance:inst-a.json');
  await until(() => {
    try {
      return (JSON.parse(readFileSync(slotFile, 'utf8')) as { tokenId: string | null }).tokenId !== null;
    } catch {
      return false;
    }
  }, 'the link renewed instance:inst-a and apply wrote its token', 30_000);
  // The token renewal wrote is a secret the outputs are searched for.
  knownSecrets.add(readFileSync(join(h.state, 'mcp-forwarder', 'inst-a.token'), 'utf8').trim());
  const fwdUrl = await healthyPart(tt);
  const st = await status(h, fwdUrl);
  tt.equal(st.code, 0);
  const s = st.status;
  tt.same(s?.parts, { forwarder: { state: 'up', via: 'healthz' }, 'cli-proxy': { state: 'down', via: 'healthz' }, link: { state: 'up', via: 'link-status' }, apply: { state: 'unknown', via: 'none' } });
  tt.same(s?.enrolment, { enrolled: true, gatewayUrl: gw.url, hostId: HOST });
  tt.equal(s?.link?.state, 'polling');
  tt.equal(s?.link?.running, true);
  tt.equal(s?.state.applied, version);
  tt.equal(s?.state.received, version);
  tt.notOk(s?.state.rejected, 'nothing rejected');
  const slot = s?.slots.find((x) => x.slot === 'instance:inst-a');
  tt.ok(slot?.tokenId, 'the slot has a token id');
  tt.ok((slot?.expiresInS ?? 0) > 0, `time to expiry is positive (${slot?.expiresInS} s)`);
  tt.ok(s?.slots.some((x) => x.slot === 'cli:notes'), 'the provider slot is listed');
  tt.notOk(s && 'lastAuditUpload' in s, 'no audit upload known: the field is omitted');
  const stText = await status(h, fwdUrl, false);
  tt.match(stText.text, /^parts: +forwarder up \(healthz\), cli-proxy down \(healthz\), link up \(link-status\), apply unknown\n/);
  tt.match(stText.text, new RegExp(`enrolment: host ${HOST} with `));
  tt.match(stText.text, /link: +polling; last sync /);
  tt.match(stText.text, new RegExp(`state: +version ${version} in force \\(applied .* ago\\); received ${version}`));
  tt.match(stText.text, /instance:inst-a +expires in /);
  tt.same(leakedSecrets(st.text + stText.text), [], 'no token or credential in status');

  // A hand edit on a managed host: a binding's upstream changed, one added, the provider removed.
  const instances = JSON.parse(readFileSync(h.instances, 'utf8')) as Record<string, { instanceId: string; upstreamUrl: string; tokenFile: string }>;
  const b1 = instances[B1];
  if (!b1) throw new Error('apply wrote no B1');
  writeJsonAtomic(h.instances, { [B1]: { ...b1, upstreamUrl: 'https://elsewhere.example.com/mcp' }, [B2]: { instanceId: 'inst-hand', upstreamUrl: 'https://gw.example.com/mcp/h', tokenFile: join(h.base, 'hand.token') } });
  writeJsonAtomic(h.providers, {});
  const drifted = await doctor(h);
  tt.equal(drifted.code, 1, 'exit 1');
  const drift = checksOf(drifted, 'drift');
  tt.equal(drift.length, 2, 'one drift problem per file');
  const [inst, prov] = [drift.find((d) => d.detail.startsWith(h.instances)), drift.find((d) => d.detail.startsWith(h.providers))];
  tt.equal(inst?.code, 'drift');
  tt.match(inst?.detail ?? '', `differs from desired state version ${version}`);
  tt.match(inst?.detail ?? '', 'binding bind… (instance inst-a) changed (upstreamUrl)');
  tt.match(inst?.detail ?? '', 'binding bind… (instance inst-hand) added by hand');
  tt.match(prov?.detail ?? '', 'provider notes missing');
  tt.notMatch(drifted.text, new RegExp(`${B1}|${B2}`), 'binding ids (capabilities) only by their prefix');
  tt.notMatch(drifted.text, /elsewhere\.example\.com/, 'no value from the edited file');
  tt.ok(drifted.report?.summary.problems.includes('drift'));

  // The fix doctor names makes apply write both files again.
  tt.match(inst?.fix ?? '', `rm ${join(h.handoff, 'applied-state.json')}`);
  await apply.stop('SIGTERM');
  rmSync(join(h.handoff, 'applied-state.json'));
  apply = await startApply(tt, h);
  await until(() => appliedVersion(h) === version, `version ${version} applied again`, 30_000);
  const fixed = await doctor(h);
  tt.equal(one(tt, fixed, 'drift')?.status, 'ok', 'no drift after the fix');
  tt.same(leakedSecrets(clean.text + drifted.text + fixed.text), [], 'no token or credential in any output');
});

t.test('enrolled, a rejected state: the version, its reason and the one in force; the link not running is named', async (tt) => {
  const h = host(tt);
  enrolled(h, 'https://gateway.example.com', `hostcred-rejected-${randomUUID()}`);
  const apply = await startApply(tt, h);
  writeJsonAtomic(join(h.handoff, 'desired-state.json'), { version: 4, bindings: { [B1]: { instanceId: 'inst-a', upstreamUrl: 'https://gw.example.com/mcp/a' } }, providers: {} });
  await apply.waitForLog((l) => l.msg === 'desired state applied' && l.version === 4, 20_000);
  writeJsonAtomic(join(h.handoff, 'desired-state.json'), { version: 5, bindings: { [B1]: { instanceId: 'inst-a', upstreamUrl: 'http://gw.example.com/mcp/a' } }, providers: {} });
  await apply.waitForLog((l) => l.msg === 'desired state rejected; the last good one stays in force' && l.version === 5, 20_000);

  const run = await doctor(h);
  tt.equal(run.code, 1);
  const ds = one(tt, run, 'desired state');
  tt.equal(ds?.code, 'state_rejected', 'the code presence sends');
  tt.match(ds?.detail ?? '', /^version 5 was rejected at .*: .*; version 4 stays in force$/);
  tt.equal(one(tt, run, 'drift')?.code, 'drift_unchecked', 'drift cannot be checked against a state no longer on disk');
  tt.equal(one(tt, run, 'link')?.code, 'link_not_running', 'no link has reported');
  tt.ok(run.report?.summary.problems.includes('state_rejected'));
  const st = await status(h, NO_PART);
  tt.equal(st.status?.state.applied, 4, 'status: version 4 in force');
  tt.equal(st.status?.state.received, 5, 'status: version 5 received');
  tt.equal(st.status?.state.rejected?.version, 5, 'status: version 5 rejected');
  tt.same(st.status?.parts.link, { state: 'unknown', via: 'none' }, 'status: no link status to go by');
  tt.match((await status(h, NO_PART, false)).text, /\n +rejected version 5 .* ago: schema: /);
});

t.test('a link that stopped: its last status is kept, and doctor says it is not running', async (tt) => {
  const h = host(tt);
  const gw = await enrolledWith(tt, h, `hostcred-stopped-${randomUUID()}`);
  gw.inject({ kind: 'status5xx', status: 503 }, { endpoint: 'state', times: 1000 });
  const link = startLink(tt, h, gw.url);
  await until(() => linkStatus(h)?.state === 'backing_off', 'the link backs off', 20_000);
  tt.equal(linkStatus(h)?.lastError?.code, 'gateway_unavailable');
  const backing = await doctor(h);
  const l = one(tt, backing, 'link');
  tt.equal(l?.code, 'link_backing_off');
  tt.equal(l?.status, 'warn', 'a fresh backoff is a warning');
  tt.match(l?.detail ?? '', /last error gateway_unavailable \(status 503\)/);
  await link.stop('SIGKILL');
  const stopped = await doctor(h);
  tt.equal(one(tt, stopped, 'link')?.code, 'link_not_running');
  tt.match(one(tt, stopped, 'link')?.detail ?? '', `pid ${link.child.pid}`);
});

checkNoLeaks(t);
