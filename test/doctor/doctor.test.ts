import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, chownSync, cpSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { Command } from 'commander';
import t from 'tap';
import { registerDoctorCommand } from '../../src/cli/doctor-command.js';
import { openCliCa } from '../../src/cli-proxy/cli-ca.js';
import { auditEventFileName, type AuditEvent } from '../../src/data/audit-event.js';
import { doctorReportSchema } from '../../src/data/doctor-report.js';
import type { LinkStatus } from '../../src/data/link-status.js';
import { runDoctor, type Finding } from '../../src/doctor/doctor.js';
import { CLI, checkNoLeaks, leakedSecrets, REPO_ROOT, writeToken } from '../support/cli-proc.js';
import { memoryLogger } from '../support/memory-log.js';
import { startProxy, type ProxyProc } from '../support/proxy-rig.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';
import { unlessMissing } from '../tools/prerequisite.js';

/*
 * Issue 5 item 4: `agent-connectors doctor` checks users/groups, directory and file owners
 * and modes, that the Agent UID cannot read any secret, ports, token freshness (slot
 * files), registry and catalog validity; prints each finding with the command that fixes
 * it; exits non-zero on a problem. A healthy fixture is built with the real users and the
 * modes of units/tmpfiles.d, then each misconfiguration is seeded on its own copy.
 */

// Nearly sixty doctor runs, four of them Node starts (see `doctor` below), and a forwarder and a
// cli-proxy: a file-wide stop sized for a busy machine, not a timing check.
t.setTimeout(600_000);

const isRoot = process.getuid?.() === 0;
const SYSUSERS = join(REPO_ROOT, 'units/sysusers.d/agent-connectors.conf');
const AGENT = 'nobody';

const needsRoot = { skip: unlessMissing(t, isRoot ? undefined : 'needs root (users, chown, setpriv)') };
function test(name: string, fn: (t: TapTest) => Promise<void>): void {
  t.test(name, needsRoot, fn);
}

interface Ids {
  ac: number;
  acGroup: number;
  renew: number;
}

function idOf(args: string[]): number {
  const r = spawnSync('id', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`id ${args.join(' ')}: ${r.stderr}`);
  return Number(r.stdout.trim());
}

function groupId(name: string): number {
  const r = spawnSync('getent', ['group', name], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`no group ${name}`);
  return Number(r.stdout.split(':')[2]);
}

/** The service users and groups, created on the host by the package's own sysusers.d file. */
function ensureUsers(): Ids {
  const r = spawnSync('systemd-sysusers', [SYSUSERS], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`systemd-sysusers ${SYSUSERS} exited ${r.status}: ${r.stderr}`);
  return { ac: idOf(['-u', 'agent-connectors']), acGroup: idOf(['-g', 'agent-connectors']), renew: groupId('agent-connectors-renew') };
}

interface Fixture {
  base: string;
  stateDir: string;
  fwdDir: string;
  cliDir: string;
  handoff: string;
  inbox: string;
  slots: string;
  instancesPath: string;
  providersPath: string;
  tokenFile: string;
  providerToken: string;
  slotFile: string;
  audit: string;
  /** TLS mode: the CLI CA's directory and the shims' bundle (outside the 0750 state root, as on a system install). */
  cliCa: string;
  bundle: string;
}

const HOUR = 3600_000;
let counter = 0;

function writeOwned(path: string, text: string, mode: number, uid: number, gid: number): void {
  writeFileSync(path, text, { mode });
  chmodSync(path, mode);
  chownSync(path, uid, gid);
}

function dir(path: string, mode: number, uid: number, gid: number): void {
  mkdirSync(path, { recursive: true });
  chownSync(path, uid, gid);
  chmodSync(path, mode);
}

function slotJson(slot: string, fields: Record<string, unknown> = {}): string {
  return JSON.stringify({
    slot,
    tokenId: 'tid-doctor-1',
    expiresAt: new Date(Date.now() + 6 * HOUR).toISOString(),
    generation: 1,
    appliedAt: new Date(Date.now() - HOUR).toISOString(),
    ...fields,
  });
}

/** A CLI CA and its bundle as the cli-proxy writes them (openCliCa), made once in setup, copied into each fixture. */
let caTemplate: { dir: string; bundle: string } | undefined;

/**
 * A healthy installation under a fresh temp dir: SPEC §2 / units/tmpfiles.d modes and
 * owners. `withCa: false` leaves the CLI CA to the cli-proxy started on the fixture.
 */
function buildFixture(ids: Ids, withCa = true): Fixture {
  const base = tempDir('ac-doctor-');
  // The parent of the state root is world-traversable, as /var/lib is.
  chmodSync(base, 0o755);
  const stateDir = join(base, 'state');
  const fwdDir = join(stateDir, 'mcp-forwarder');
  const cliDir = join(stateDir, 'cli-proxy');
  const handoff = join(stateDir, 'handoff');
  const inbox = join(handoff, 'inbox');
  const slots = join(handoff, 'slots');
  dir(stateDir, 0o750, ids.ac, ids.renew);
  dir(fwdDir, 0o700, ids.ac, ids.acGroup);
  dir(cliDir, 0o700, ids.ac, ids.acGroup);
  dir(handoff, 0o3770, ids.ac, ids.renew);
  dir(inbox, 0o2770, ids.ac, ids.renew);
  dir(slots, 0o2770, ids.ac, ids.renew);
  const audit = join(stateDir, 'audit');
  dir(audit, 0o2770, ids.ac, ids.renew);

  counter++;
  const tokenFile = join(fwdDir, 'inst-a.token');
  writeToken(tokenFile, `tok-doctor-fwd-${counter}-Q7x9`);
  chownSync(tokenFile, ids.ac, ids.acGroup);
  const providerToken = join(cliDir, 'notion.token');
  writeToken(providerToken, `tok-doctor-cli-${counter}-Z3k8`);
  chownSync(providerToken, ids.ac, ids.acGroup);

  const instancesPath = join(fwdDir, 'instances.json');
  writeOwned(instancesPath, JSON.stringify({ bind_doctor_0001: { instanceId: 'inst-a', upstreamUrl: 'https://gateway.example/mcp', tokenFile } }, null, 2), 0o600, ids.ac, ids.acGroup);
  const providersPath = join(cliDir, 'providers.json');
  writeOwned(
    providersPath,
    JSON.stringify({ notion: { upstream: 'https://api.notion.com/v1', tokenFile: providerToken, inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: 'ntn' }] } }, null, 2),
    0o600,
    ids.ac,
    ids.acGroup,
  );
  const slotFile = join(slots, 'instance:inst-a.json');
  writeOwned(slotFile, slotJson('instance:inst-a'), 0o640, ids.ac, ids.renew);
  writeOwned(join(slots, 'cli:notion.json'), slotJson('cli:notion'), 0o640, ids.ac, ids.renew);
  // The proxies' agent-users file, as install writes it.
  writeFileSync(join(base, 'agent-users'), `# agents\n${AGENT}\n`, { mode: 0o644 });
  const cliCa = join(stateDir, 'cli-ca');
  const bundle = join(base, 'ca', 'ca-bundle.pem');
  if (withCa) {
    if (!caTemplate) throw new Error('no CA template (setup did not run)');
    cpSync(caTemplate.dir, cliCa, { recursive: true, preserveTimestamps: true });
    cpSync(caTemplate.bundle, bundle, { preserveTimestamps: true });
    chmodSync(join(base, 'ca'), 0o755);
    for (const p of [cliCa, join(cliCa, 'ca.pem'), join(cliCa, 'ca-cert.pem')]) chownSync(p, ids.ac, ids.acGroup);
  }
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  return { base, stateDir, fwdDir, cliDir, handoff, inbox, slots, instancesPath, providersPath, tokenFile, providerToken, slotFile, audit, cliCa, bundle };
}

interface DoctorRun {
  code: number | null;
  stdout: string;
  stderr: string;
  findings: Finding[];
}

/** Everything every doctor run printed, for the leak check. */
const doctorOutput: string[] = [];

type Output = Pick<DoctorRun, 'code' | 'stdout' | 'stderr'>;

/**
 * Runs `doctor ARGS` and reads its report. In this process unless `spawned`: the command as
 * the CLI registers it (its options, checks, report and exit code: src/cli/doctor-command.ts),
 * its output and exit code taken instead of the process's. A Node start per run cost a
 * second or more of CPU on the shared 2-core VM, and nearly sixty of them were most of this
 * file's time. `spawned` runs the built CLI, for what a user's shell sees: the report on
 * stdout and the exit status (a healthy host, a problem in JSON, the text report).
 */
async function doctor(args: string[], how: 'in-process' | 'spawned' = 'in-process'): Promise<DoctorRun> {
  const { code, stdout, stderr } = how === 'spawned' ? await doctorSpawned(args) : await doctorInProcess(args);
  doctorOutput.push(stdout, stderr);
  let findings: Finding[] = [];
  if (args.includes('--json')) {
    try {
      // One document, valid against its schema; its checks read back as findings.
      const report = doctorReportSchema.parse(JSON.parse(stdout));
      findings = report.checks.map(({ status, ...rest }) => ({ level: status, ...rest }));
      if (report.summary.exitCode !== code) throw new Error(`summary.exitCode ${report.summary.exitCode} but exit ${code}`);
    } catch (err) {
      throw new Error(`doctor --json printed no valid report (exit ${code}): ${(err as Error).message}\n${stdout}\n${stderr}`);
    }
  }
  return { code, stdout, stderr, findings };
}

async function doctorInProcess(args: string[]): Promise<Output> {
  const run: Output = { code: null, stdout: '', stderr: '' };
  // exitOverride: a usage error rejects here instead of ending the test's process.
  const program = new Command('agent-connectors').exitOverride().configureOutput({
    writeOut: (text) => (run.stdout += text),
    writeErr: (text) => (run.stderr += text),
  });
  registerDoctorCommand(program, {
    write: (text) => {
      run.stdout += text;
    },
    exit: (code) => {
      run.code = code;
    },
  });
  await program.parseAsync(['doctor', ...args], { from: 'user' });
  if (run.code === null) throw new Error(`doctor ${args.join(' ')} ended without an exit code: ${run.stderr}`);
  return run;
}

async function doctorSpawned(args: string[]): Promise<Output> {
  // `env -u NODE_OPTIONS`, as startCli does: tap's spawn hook puts its loaders back into
  // any env given here, and they double a CLI's start-up on a busy machine.
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, CLI, 'doctor', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NOTIFY_SOCKET: '' } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, stdout, stderr };
}

const problems = (r: { findings: Finding[] }): Finding[] => r.findings.filter((f) => f.level === 'problem');

/** Runs a shell command as `nobody` (no groups): can the Agent UID really read `path`? */
function nobodyCanRead(path: string): boolean {
  // From / with nothing of the test's environment (env -i first: tap's spawn hooks add to
  // any env given here), like any process a test runs as another user.
  const r = spawnSync('/usr/bin/env', ['-i', 'PATH=/usr/bin:/bin', 'setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups', 'cat', path], {
    encoding: 'utf8',
    cwd: '/',
    env: {},
  });
  // Only "cannot read" means no: setpriv or cat failing for another reason is an error.
  if (r.status !== 0 && !/Permission denied/.test(r.stderr)) throw new Error(`setpriv cat ${path} as nobody failed (${r.status ?? r.signal}): ${r.stderr}`);
  return r.status === 0;
}

/** Applies a finding's fix when it is a plain chmod/chown of a fixture path (nothing outside it). */
function applyFix(fix: string, fx: Fixture): void {
  if (!/^(chmod|chown) /.test(fix) || fix.includes(';') || !fix.includes(fx.base)) throw new Error(`not a local chmod/chown fix: ${fix}`);
  const r = spawnSync('/bin/sh', ['-c', fix], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`fix "${fix}" failed: ${r.stderr}`);
}

let ids: Ids = { ac: -1, acGroup: -1, renew: -1 };
let fwd: ProxyProc | undefined;
let proxy: ProxyProc | undefined;
let healthy: Fixture | undefined;

function baseArgs(fx: Fixture, extra: string[] = []): string[] {
  // A credential path of the fixture's own, which does not exist: never enrolled, whatever this machine has in /etc.
  return ['--state-dir', fx.stateDir, '--ca-bundle', fx.bundle, '--credential', join(fx.base, 'host-credential'), '--agent-users-file', join(fx.base, 'agent-users'), '--agent-user', AGENT, '--no-systemd', '--json', '--forwarder-url', fwd?.base ?? '', '--cli-proxy-url', proxy?.base ?? '', ...extra];
}

/** One problem finding for `check` whose detail matches `detail`, with a fix; fails loudly otherwise. */
function findProblem(tt: TapTest, run: DoctorRun, check: string, detail: RegExp): Finding | undefined {
  const f = problems(run).find((p) => p.check === check && detail.test(p.detail));
  tt.ok(f, `a ${check} problem matching ${detail} (got ${JSON.stringify(problems(run))})`);
  if (f) tt.ok(typeof f.fix === 'string' && f.fix.length > 0, `${check}: it names a fix`);
  if (f) tt.match(f.code ?? '', /^[a-z][a-z0-9_]+$/, `${check}: it has a problem code`);
  return f;
}

test('setup: users from units/sysusers.d, a healthy fixture, a running forwarder and cli-proxy', async (tt) => {
  ids = ensureUsers();
  tt.ok(ids.ac > 0, `agent-connectors exists (uid ${ids.ac})`);
  tt.ok(ids.renew > 0, `agent-connectors-renew exists (gid ${ids.renew})`);
  const template = tempDir('ac-doctor-ca-template-');
  t.teardown(() => rmSync(template, { recursive: true, force: true }));
  caTemplate = { dir: join(template, 'cli-ca'), bundle: join(template, 'ca-bundle.pem') };
  await openCliCa(caTemplate, memoryLogger().log);
  healthy = buildFixture(ids, false);
  // Started on the root tap object: they serve every subtest below.
  fwd = await startProxy(t, 'forwarder', { stateDir: healthy.stateDir });
  await fwd.waitForLog((l) => l.msg === 'registry loaded' && l.instances === 1);
  proxy = await startProxy(t, 'cli-proxy', { stateDir: healthy.stateDir, args: ['--ca-bundle', healthy.bundle] });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  // It made the CLI CA as root (the test's user); on a host it runs as agent-connectors.
  for (const p of [healthy.cliCa, join(healthy.cliCa, 'ca.pem'), join(healthy.cliCa, 'ca-cert.pem')]) chownSync(p, ids.ac, ids.acGroup);
  tt.ok(fwd.port > 0 && proxy.port > 0, 'both listening');
});

test('healthy fixture: exit 0, no problem, every area checked', async (tt) => {
  if (!healthy) throw new Error('no fixture');
  const run = await doctor(baseArgs(healthy), 'spawned');
  tt.equal(run.code, 0, `exit 0 (stderr: ${run.stderr})`);
  tt.same(problems(run), [], 'no problem');
  tt.same(run.findings.filter((f) => f.level === 'warn'), [], 'no warning either');
  const checks = new Set(run.findings.map((f) => f.check));
  for (const c of ['users', 'directories', 'registry', 'catalog', 'cli ca', 'ca bundle', 'agent user', 'renewal', 'ports', 'audit']) tt.ok(checks.has(c), `checked: ${c}`);
  tt.notOk(checks.has('units'), '--no-systemd skips the units');
  for (const c of ['enrolment', 'link', 'desired state', 'drift']) tt.notOk(checks.has(c), `never enrolled: no ${c} check`);
  tt.equal(run.findings.filter((f) => f.check === 'directories' && f.level === 'ok').length, 6, 'all six directories ok');
  tt.equal(run.findings.filter((f) => f.check === 'renewal' && f.level === 'ok').length, 2, 'both slots fresh');
  tt.equal(run.findings.filter((f) => f.check === 'ports' && f.level === 'ok').length, 2, 'both ports answer');
  // doctor's verdict agrees with what nobody can actually do.
  for (const p of [healthy.tokenFile, healthy.providerToken, healthy.instancesPath, healthy.providersPath]) tt.notOk(nobodyCanRead(p), `nobody really cannot read ${p}`);

  const text = await doctor(baseArgs(healthy).filter((a) => a !== '--json'), 'spawned');
  tt.equal(text.code, 0);
  tt.match(text.stdout, /no problems\n$/, 'text output ends with "no problems"');
  tt.notMatch(text.stdout, /FAIL/);
});

test('agent-users file missing or naming nobody (every agent gets 403): a problem with its fix; fixed, no problem', async (tt) => {
  const fx = buildFixture(ids);
  const file = join(fx.base, 'agent-users');
  for (const [how, prepare] of [
    ['missing', () => rmSync(file)],
    ['only comments', () => writeFileSync(file, '# nobody yet\n\n')],
  ] as const) {
    prepare();
    const run = await doctor(baseArgs(fx));
    tt.equal(run.code, 1, `${how}: exit 1`);
    const f = findProblem(tt, run, 'agent users', /every agent gets 403/);
    tt.equal(f?.code, 'agent_users_empty', `${how}: code agent_users_empty`);
    tt.equal(f?.fix, `echo ${AGENT} >> ${file} (the proxies re-read it by themselves)`, `${how}: the fix names the agent user`);
  }
  writeFileSync(file, `${AGENT}\n`, { flag: 'a' });
  tt.same(problems(await doctor(baseArgs(fx))), [], 'after the fix: no problem');
});

test('a revoked host (host-revoked.json in the hand-off): host_revoked, with enroll as the fix', async (tt) => {
  const fx = buildFixture(ids);
  const marker = join(fx.handoff, 'host-revoked.json');
  writeFileSync(marker, JSON.stringify({ at: new Date().toISOString(), by: 'gateway' }));
  const run = await doctor(baseArgs(fx), 'spawned');
  tt.equal(run.code, 1);
  const f = findProblem(tt, run, 'revocation', /access ended for the whole host .*401/);
  tt.equal(f?.code, 'host_revoked');
  tt.match(f?.fix ?? '', /^agent-connectors enroll --gateway URL --force/);
  rmSync(marker);
  tt.same(problems(await doctor(baseArgs(fx))), [], 'enrolled again (no marker): no problem');
});

test('token file mode 0644 inside the protected state dir: tokens problem with chmod 600; nobody still cannot read it', async (tt) => {
  const fx = buildFixture(ids);
  chmodSync(fx.tokenFile, 0o644);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1, 'exit 1');
  const f = findProblem(tt, run, 'tokens', /mode 644/);
  tt.equal(f?.fix, `chmod 600 ${fx.tokenFile}`);
  tt.notOk(nobodyCanRead(fx.tokenFile), 'nobody cannot traverse the 0750 state dir');
  tt.notOk(problems(run).some((p) => p.check === 'agent user'), 'so no agent-user problem');
  if (f?.fix) applyFix(f.fix, fx);
  const again = await doctor(baseArgs(fx));
  tt.equal(again.code, 0, 'after the fix: exit 0');
  tt.same(problems(again), []);
});

test('token file 0644 where nobody can reach it: tokens problem and an agent-user problem', async (tt) => {
  const fx = buildFixture(ids);
  const exposedDir = join(fx.base, 'exposed');
  dir(exposedDir, 0o755, ids.ac, ids.acGroup);
  const exposed = join(exposedDir, 'inst-a.token');
  writeToken(exposed, 'tok-doctor-exposed-W4v2');
  chownSync(exposed, ids.ac, ids.acGroup);
  chmodSync(exposed, 0o644);
  writeOwned(fx.instancesPath, JSON.stringify({ bind_doctor_0001: { instanceId: 'inst-a', upstreamUrl: 'https://gateway.example/mcp', tokenFile: exposed } }), 0o600, ids.ac, ids.acGroup);
  tt.ok(nobodyCanRead(exposed), 'nobody really can read it (setpriv cat)');
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  const tok = findProblem(tt, run, 'tokens', /mode 644/);
  tt.match(tok?.fix ?? '', /^chmod 600 /);
  const agent = findProblem(tt, run, 'agent user', new RegExp(`nobody can read ${exposed.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`));
  tt.match(agent?.fix ?? '', /chmod o-rwx/, 'the fix removes the other-read bit');
  tt.match(agent?.fix ?? '', exposed);
  tt.same(leakedSecrets(run.stdout), [], 'the token itself is never printed');
  if (tok?.fix) applyFix(tok.fix, fx);
  tt.notOk(nobodyCanRead(exposed), 'after the fix nobody cannot read it');
  const again = await doctor(baseArgs(fx));
  tt.same(problems(again), [], 'after the fix: no problem');
});

test('world-readable registry in traversable directories: directory problems and agent user can read instances.json', async (tt) => {
  const fx = buildFixture(ids);
  chmodSync(fx.stateDir, 0o755);
  chmodSync(fx.fwdDir, 0o755);
  chmodSync(fx.instancesPath, 0o644);
  tt.ok(nobodyCanRead(fx.instancesPath), 'nobody really can read it');
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.equal(findProblem(tt, run, 'directories', new RegExp(`^${fx.stateDir} has mode 755, expected 750`))?.fix, `chmod 750 ${fx.stateDir}`);
  tt.equal(findProblem(tt, run, 'directories', new RegExp(`^${fx.fwdDir} has mode 755, expected 700`))?.fix, `chmod 700 ${fx.fwdDir}`);
  findProblem(tt, run, 'agent user', /nobody can read .*instances\.json$/);
});

test('a directory with a wrong mode (each of the six), with the chmod that fixes it', async (tt) => {
  const cases: Array<[keyof Fixture, number, string]> = [
    ['stateDir', 0o755, '750'],
    ['fwdDir', 0o750, '700'],
    ['cliDir', 0o711, '700'],
    // 0.1.0's mode, before the sticky bit.
    ['handoff', 0o2770, '3770'],
    ['inbox', 0o2775, '2770'],
    ['slots', 0o777, '2770'],
  ];
  // Each on its own fixture, all at once (a doctor run is a process start).
  await Promise.all(
    cases.map(async ([key, bad, want]) => {
      const fx = buildFixture(ids);
      const path = fx[key];
      chmodSync(path, bad);
      const run = await doctor(baseArgs(fx));
      tt.equal(run.code, 1, `${key} ${bad.toString(8)}: exit 1`);
      const f = findProblem(tt, run, 'directories', new RegExp(`^${path} has mode ${bad.toString(8)}, expected ${want}$`));
      tt.equal(f?.fix, `chmod ${want} ${path}`, `${key}: chmod ${want}`);
      if (f?.fix) applyFix(f.fix, fx);
      tt.same(problems(await doctor(baseArgs(fx))), [], `${key}: fixed by its fix`);
    }),
  );
});

test('a directory owned by the wrong user or group, with the chown that fixes it', async (tt) => {
  const fx = buildFixture(ids);
  chownSync(fx.fwdDir, 0, 0);
  chownSync(fx.slots, ids.ac, ids.acGroup);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.equal(findProblem(tt, run, 'directories', new RegExp(`^${fx.fwdDir} is not owned by agent-connectors:agent-connectors$`))?.fix, `chown agent-connectors:agent-connectors ${fx.fwdDir}`);
  tt.equal(findProblem(tt, run, 'directories', new RegExp(`^${fx.slots} is not owned by agent-connectors:agent-connectors-renew$`))?.fix, `chown agent-connectors:agent-connectors-renew ${fx.slots}`);
  for (const f of problems(run)) if (f.fix) applyFix(f.fix, fx);
  tt.same(problems(await doctor(baseArgs(fx))), [], 'fixed by its fixes');
});

test('a missing directory → systemd-tmpfiles fix', async (tt) => {
  const fx = buildFixture(ids);
  rmSync(fx.inbox, { recursive: true });
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.match(findProblem(tt, run, 'directories', /inbox is missing$/)?.fix ?? '', /^systemd-tmpfiles --create /);
});

test('a token file owned by root (mode 600) → chown agent-connectors', async (tt) => {
  const fx = buildFixture(ids);
  chownSync(fx.providerToken, 0, 0);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  const f = findProblem(tt, run, 'tokens', /not owned by agent-connectors/);
  tt.match(f?.fix ?? '', /^chown agent-connectors/);
  tt.match(f?.fix ?? '', fx.providerToken);
  if (f?.fix) applyFix(f.fix, fx);
  tt.same(problems(await doctor(baseArgs(fx))), [], 'fixed by its fix');
});

test('a token file named by the registry that does not exist → points at the renewal logs', async (tt) => {
  const fx = buildFixture(ids);
  rmSync(fx.tokenFile);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.match(findProblem(tt, run, 'tokens', /does not exist/)?.fix ?? '', /journalctl -u agent-connectors-link/);
});

test('a missing user, a missing group, a user not in the group (in-process, fake passwd/group)', async (tt) => {
  const fx = buildFixture(ids);
  const dirs = tempDir('ac-doctor-accounts-');
  tt.teardown(() => rmSync(dirs, { recursive: true, force: true }));
  const passwd = readFileSync('/etc/passwd', 'utf8');
  const group = readFileSync('/etc/group', 'utf8');
  const without = (text: string, name: string): string => text.split('\n').filter((l) => !l.startsWith(`${name}:`)).join('\n');
  const write = (name: string, text: string): string => {
    const p = join(dirs, name);
    writeFileSync(p, text);
    return p;
  };
  const common = { stateDir: fx.stateDir, handoffDir: fx.handoff, caBundle: fx.bundle, agentUser: AGENT, forwarderUrl: fwd?.base ?? '', cliProxyUrl: proxy?.base ?? '', systemd: false };

  const baseline = await runDoctor({ ...common, passwdPath: write('passwd', passwd), groupPath: write('group', group) });
  tt.same(baseline.filter((f) => f.level === 'problem'), [], 'the unchanged copies: no problem');

  const noUser = await runDoctor({ ...common, passwdPath: write('passwd-no-user', without(passwd, 'agent-connectors')), groupPath: write('group', group) });
  const u = noUser.find((f) => f.level === 'problem' && f.check === 'users' && /user agent-connectors is missing/.test(f.detail));
  tt.ok(u, 'missing user found');
  tt.match(u?.fix ?? '', /^systemd-sysusers /, 'fix: systemd-sysusers');

  const noGroup = await runDoctor({ ...common, passwdPath: write('passwd', passwd), groupPath: write('group-no-renew', without(group, 'agent-connectors-renew')) });
  const g = noGroup.find((f) => f.level === 'problem' && f.check === 'users' && /group agent-connectors-renew is missing/.test(f.detail));
  tt.ok(g, 'missing group found');
  tt.match(g?.fix ?? '', /^systemd-sysusers /);

  const notMember = group
    .split('\n')
    .map((l) => (l.startsWith('agent-connectors-renew:') ? l.split(':').slice(0, 3).join(':') + ':' : l))
    .join('\n');
  const noMember = await runDoctor({ ...common, passwdPath: write('passwd', passwd), groupPath: write('group-no-member', notMember) });
  const m = noMember.find((f) => f.level === 'problem' && f.check === 'users' && /not in group agent-connectors-renew/.test(f.detail));
  tt.ok(m, 'missing membership found');
  tt.equal(m?.fix, 'usermod -aG agent-connectors-renew agent-connectors');

  const noAgent = await runDoctor({ ...common, passwdPath: write('passwd-no-nobody', without(passwd, AGENT)), groupPath: write('group', group) });
  tt.ok(noAgent.some((f) => f.level === 'problem' && f.check === 'agent user' && /no such user nobody/.test(f.detail)), 'an unknown agent user is a problem');
});

test('an agent user in the hand-off group (fake group file, in-process) can read the inbox and its files: flagged', async (tt) => {
  const fx = buildFixture(ids);
  const inboxFile = join(fx.inbox, 'instance:inst-a.json');
  // fetch writes inbox files 0640 with the setgid group: a 200 body carrying a token.
  writeOwned(inboxFile, JSON.stringify({ slot: 'instance:inst-a', tokenId: 'tid-2', token: 'tok-doctor-inbox-P5s1', expiresAt: new Date(Date.now() + 6 * HOUR).toISOString(), credentialGeneration: 1 }), 0o640, ids.ac, ids.renew);
  // The link now writes batches (inbox/batch-<sequence>-<random>.json), tokens inside too.
  const batchFile = join(fx.inbox, 'batch-1893499200000000-0123456789ab.json');
  writeOwned(batchFile, JSON.stringify({ v: 1, entries: [{ slot: 'instance:inst-a', tokenId: 'tid-3', token: 'tok-doctor-batch-Q7t2', expiresAt: new Date(Date.now() + 6 * HOUR).toISOString(), credentialGeneration: 1 }] }), 0o640, ids.ac, ids.renew);
  const files = tempDir('ac-doctor-accounts-');
  tt.teardown(() => rmSync(files, { recursive: true, force: true }));
  const group = readFileSync('/etc/group', 'utf8')
    .split('\n')
    .map((l) => (l.startsWith('agent-connectors-renew:') ? `${l}${l.endsWith(':') ? '' : ','}${AGENT}` : l))
    .join('\n');
  writeFileSync(join(files, 'group'), group);
  const common = { stateDir: fx.stateDir, handoffDir: fx.handoff, caBundle: fx.bundle, forwarderUrl: fwd?.base ?? '', cliProxyUrl: proxy?.base ?? '', systemd: false, groupPath: join(files, 'group') };
  const findings = await runDoctor({ ...common, agentUser: AGENT });
  const readable = findings.filter((f) => f.level === 'problem' && f.check === 'agent user').map((f) => f.detail);
  tt.ok(readable.some((d) => d.endsWith(`can read ${fx.inbox}`)), `the inbox directory is flagged (got ${JSON.stringify(readable)})`);
  tt.ok(readable.some((d) => d.endsWith(`can read ${inboxFile}`)), 'the inbox file is flagged');
  tt.ok(readable.some((d) => d.endsWith(`can read ${batchFile}`)), 'a batch file is flagged the same (a secret, not junk)');
  tt.notOk(readable.some((d) => d.includes(fx.tokenFile)), 'the 0600 token file is not');
  // With the real group file nobody is not in the group: nothing readable.
  const real = await runDoctor({ ...common, groupPath: '/etc/group', agentUser: AGENT });
  tt.same(real.filter((f) => f.check === 'agent user' && f.level === 'problem'), [], 'real membership: nothing readable');
});

test('a registry binding and a catalog provider with no slot file: renewal will never renew them → not reported as fine', async (tt) => {
  // SPEC §4: fetch renews only the slots that have slots/<slot>.json (bind creates it).
  // Without one the binding's token is never renewed and silently expires.
  const fx = buildFixture(ids);
  rmSync(fx.slotFile);
  rmSync(join(fx.slots, 'cli:notion.json'));
  const run = await doctor(baseArgs(fx));
  const about = (slot: string): Finding | undefined => run.findings.find((f) => f.level !== 'ok' && f.detail.includes(slot));
  tt.ok(about('instance:inst-a') ?? run.findings.find((f) => f.level !== 'ok' && f.detail.includes('inst-a')), `the binding without a slot is reported (findings: ${JSON.stringify(run.findings.filter((f) => f.level !== 'ok'))})`);
  tt.ok(about('cli:notion') ?? run.findings.find((f) => f.level !== 'ok' && f.detail.includes('notion')), 'the provider without a slot is reported');
});

test('an unknown --agent-user on the command line → problem, exit 1', async (tt) => {
  if (!healthy) throw new Error('no fixture');
  const run = await doctor(baseArgs(healthy).map((a) => (a === AGENT ? 'no-such-agent-user' : a)));
  tt.equal(run.code, 1);
  tt.ok(problems(run).some((p) => p.check === 'agent user' && /no-such-agent-user/.test(p.detail)));
});

test('a stale token: slot expiresAt in the past', async (tt) => {
  const fx = buildFixture(ids);
  const expired = new Date(Date.now() - 5 * 60_000).toISOString();
  writeOwned(fx.slotFile, slotJson('instance:inst-a', { expiresAt: expired }), 0o640, ids.ac, ids.renew);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  const f = findProblem(tt, run, 'renewal', /instance:inst-a token expired at/);
  tt.match(f?.detail ?? '', expired);
  tt.match(f?.fix ?? '', /journalctl -u agent-connectors-link/);
  tt.ok(run.findings.some((x) => x.level === 'ok' && x.check === 'renewal' && /cli:notion/.test(x.detail)), 'the other slot is still fine');
});

test('a slot never renewed (tokenId null)', async (tt) => {
  const fx = buildFixture(ids);
  writeOwned(fx.slotFile, JSON.stringify({ slot: 'instance:inst-a', tokenId: null, expiresAt: null, generation: 0 }), 0o640, ids.ac, ids.renew);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.match(findProblem(tt, run, 'renewal', /instance:inst-a has never received a token/)?.fix ?? '', /journalctl -u agent-connectors-link/);
});

test('a revoked slot', async (tt) => {
  const fx = buildFixture(ids);
  writeOwned(fx.slotFile, slotJson('instance:inst-a', { revoked: true }), 0o640, ids.ac, ids.renew);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.match(findProblem(tt, run, 'renewal', /instance:inst-a was revoked/)?.fix ?? '', /agent-connectors unbind/);
});

test('an invalid slot file', async (tt) => {
  const fx = buildFixture(ids);
  writeOwned(fx.slotFile, '{"slot":"instance:inst-a",', 0o640, ids.ac, ids.renew);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1);
  tt.match(findProblem(tt, run, 'renewal', /instance:inst-a\.json is invalid/)?.fix ?? '', /^rm /);
});

test('a bad registry: invalid JSON, and valid JSON that breaks the schema', async (tt) => {
  for (const [what, text, detail] of [
    ['invalid JSON', '{"bind_doctor_0001": {', /invalid JSON/],
    ['schema', JSON.stringify({ bind_doctor_0001: { instanceId: 'inst-a', upstreamUrl: 'http://gateway.example/mcp', tokenFile: '/x' } }), /schema/],
  ] as const) {
    const fx = buildFixture(ids);
    writeOwned(fx.instancesPath, text, 0o600, ids.ac, ids.acGroup);
    const run = await doctor(baseArgs(fx));
    tt.equal(run.code, 1, `${what}: exit 1`);
    const f = findProblem(tt, run, 'registry', detail);
    tt.match(f?.detail ?? '', fx.instancesPath, `${what}: names the file`);
    tt.match(f?.fix ?? '', fx.instancesPath, `${what}: the fix names the file`);
  }
});

test('a bad catalog: invalid JSON, and a provider without inject', async (tt) => {
  for (const [what, text, detail] of [
    ['invalid JSON', 'not json', /invalid JSON/],
    ['schema', JSON.stringify({ notion: { upstream: 'https://api.notion.com/v1', tokenFile: '/x' } }), /schema/],
  ] as const) {
    const fx = buildFixture(ids);
    writeOwned(fx.providersPath, text, 0o600, ids.ac, ids.acGroup);
    const run = await doctor(baseArgs(fx));
    tt.equal(run.code, 1, `${what}: exit 1`);
    const f = findProblem(tt, run, 'catalog', detail);
    tt.match(f?.fix ?? '', fx.providersPath, `${what}: the fix names the file`);
  }
});

test('TLS mode: a CLI CA key others may read and a bundle without the CA, each a problem with its fix; the key counts as a secret', async (tt) => {
  const fx = buildFixture(ids);
  const key = join(fx.cliCa, 'ca.pem');
  chmodSync(key, 0o644);
  writeFileSync(fx.bundle, '# no CA here\n');
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 1, 'exit 1');
  const exposed = findProblem(tt, run, 'cli ca', /ca\.pem has mode 644: the CLI CA's private key may be known to others/);
  tt.equal(exposed?.code, 'cli_ca_key_exposed');
  tt.equal(exposed?.fix, `rm ${key} && systemctl restart agent-connectors-cli-proxy (a new CA; the shims' bundle gets it)`);
  const stale = findProblem(tt, run, 'ca bundle', /does not hold the CLI CA's certificate/);
  tt.equal(stale?.code, 'ca_bundle_stale');
  tt.notOk(problems(run).some((p) => p.check === 'agent user'), 'the 0700 directory still keeps the agent out');
  tt.notOk(nobodyCanRead(key), 'as nobody really finds');

  chmodSync(fx.stateDir, 0o755);
  chmodSync(fx.cliCa, 0o755);
  tt.ok(nobodyCanRead(key), 'with the directories open, nobody reads the key');
  const open = await doctor(baseArgs(fx));
  tt.equal(findProblem(tt, open, 'cli ca', /has mode 755, expected 700/)?.fix, `chmod 700 ${fx.cliCa}`);
  tt.equal(findProblem(tt, open, 'agent user', new RegExp(`nobody can read ${key.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`))?.code, 'agent_reads_secret', 'the CA key is one of the secrets');
});

test('a stopped forwarder / cli-proxy (port closed) → ports problem with systemctl start', async (tt) => {
  if (!healthy) throw new Error('no fixture');
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const closedPort = (srv.address() as AddressInfo).port;
  await new Promise<void>((r) => srv.close(() => r()));
  const closed = `http://127.0.0.1:${closedPort}`;

  const run = await doctor(baseArgs(healthy).map((a) => (a === fwd?.base ? closed : a)));
  tt.equal(run.code, 1);
  tt.equal(findProblem(tt, run, 'ports', /forwarder does not answer/)?.fix, 'systemctl start agent-connectors-forwarder');
  tt.ok(run.findings.some((f) => f.level === 'ok' && f.check === 'ports' && /cli-proxy answers/.test(f.detail)), 'the cli-proxy still answers');

  const run2 = await doctor(baseArgs(healthy).map((a) => (a === proxy?.base ? closed : a)));
  tt.equal(run2.code, 1);
  tt.equal(findProblem(tt, run2, 'ports', /cli-proxy does not answer/)?.fix, 'systemctl start agent-connectors-cli-proxy');
});

test('text output: each problem marked FAIL with its fix line, and a problem count', async (tt) => {
  const fx = buildFixture(ids);
  chmodSync(fx.tokenFile, 0o640);
  chmodSync(fx.cliDir, 0o755);
  const run = await doctor(baseArgs(fx).filter((a) => a !== '--json'), 'spawned');
  tt.equal(run.code, 1);
  tt.match(run.stdout, new RegExp(`FAIL  tokens: ${fx.tokenFile} has mode 640, expected 600\\n      fix: chmod 600 ${fx.tokenFile}\\n`));
  tt.match(run.stdout, new RegExp(`FAIL  directories: ${fx.cliDir} has mode 755, expected 700\\n      fix: chmod 700 ${fx.cliDir}\\n`));
  tt.match(run.stdout, /\n2 problem\(s\)\n$/);
});

test('no host credential (with systemd): the fix is enroll, with the --credential doctor was given', async (tt) => {
  if (!healthy) throw new Error('no fixture');
  const credential = join(healthy.base, 'host-credential');
  const run = await doctor(baseArgs(healthy).filter((a) => a !== '--no-systemd'));
  const missing = run.findings.find((f) => f.code === 'credential_missing');
  tt.equal(missing?.level, 'warn', 'credential_missing is a warning');
  tt.equal(missing?.fix, `agent-connectors enroll --gateway URL --credential ${credential}`, 'the fix enrols, never a credential pasted by hand');
});

test('units are checked unless --no-systemd: each unit finding has a fix', async (tt) => {
  if (!healthy) throw new Error('no fixture');
  const run = await doctor(baseArgs(healthy).filter((a) => a !== '--no-systemd'));
  const units = run.findings.filter((f) => f.check === 'units');
  if (!existsSync('/run/systemd/system')) {
    // No systemd as PID 1 here (CI, containers): one warning that says so, not four failures.
    tt.equal(units.length, 1, 'one unit finding');
    tt.equal(units[0]?.level, 'warn');
    tt.match(units[0]?.detail ?? '', /systemd is not running/);
    return;
  }
  tt.equal(units.length, 4, 'four units checked');
  for (const u of units.filter((f) => f.level === 'problem')) tt.ok(u.fix, `${u.detail}: has a fix`);
  tt.equal(run.code, units.some((f) => f.level === 'problem') ? 1 : 0, 'exit code follows the unit findings');
});

/** `n` spooled events whose requests arrived `ageMs` ago, as the cli-proxy names and writes them. */
function spoolEvents(fx: Fixture, n: number, ageMs: number): void {
  for (let i = 0; i < n; i++) {
    const e: AuditEvent = { id: randomUUID(), time: new Date(Date.now() - ageMs + i).toISOString(), provider: 'notion', method: 'GET', path: '/v1/pages', status: 200, bytesIn: 0, bytesOut: 10, durationMs: 3, peerUid: 1000 };
    writeOwned(join(fx.audit, auditEventFileName(e)), `${JSON.stringify(e)}\n`, 0o640, ids.ac, ids.renew);
  }
}

const auditFindings = (findings: Finding[]): Finding[] => findings.filter((f) => f.check === 'audit');

test('the audit spool directory: missing, 770 (made by a process, not tmpfiles), a wrong mode, a wrong owner; each with its fix', async (tt) => {
  const cases: Array<[string, (fx: Fixture) => void, 'warn' | 'problem', RegExp, (fx: Fixture) => string | RegExp]> = [
    ['missing', (fx) => rmSync(fx.audit, { recursive: true }), 'problem', /is missing: the cli-proxy records no CLI call$/, () => /^systemd-tmpfiles --create /],
    ['770', (fx) => chmodSync(fx.audit, 0o770), 'warn', /has mode 770, not tmpfiles' 2770/, (fx) => `chmod 2770 ${fx.audit}`],
    ['755', (fx) => chmodSync(fx.audit, 0o755), 'problem', /has mode 755, expected 2770$/, (fx) => `chmod 2770 ${fx.audit}`],
    ['owner', (fx) => chownSync(fx.audit, ids.ac, ids.acGroup), 'problem', /is not owned by agent-connectors:agent-connectors-renew$/, (fx) => `chown -R agent-connectors:agent-connectors-renew ${fx.audit}`],
  ];
  await Promise.all(
    cases.map(async ([what, spoil, level, detail, fix]) => {
      const fx = buildFixture(ids);
      spoil(fx);
      const run = await doctor(baseArgs(fx));
      const f = auditFindings(run.findings).find((x) => x.level === level && detail.test(x.detail));
      tt.ok(f, `${what}: a ${level} matching ${detail} (got ${JSON.stringify(auditFindings(run.findings))})`);
      tt.equal(run.code, level === 'problem' ? 1 : 0, `${what}: exit code`);
      const want = fix(fx);
      if (typeof want === 'string') tt.equal(f?.fix, want, `${what}: the fix`);
      else tt.match(f?.fix ?? '', want, `${what}: the fix`);
      tt.match(f?.code ?? '', /^[a-z][a-z0-9_]+$/, `${what}: a code`);
      if (f?.fix && typeof want === 'string') {
        applyFix(f.fix, fx);
        const again = await doctor(baseArgs(fx));
        tt.same(auditFindings(again.findings).filter((x) => x.level !== 'ok'), [], `${what}: fixed by its fix`);
      }
    }),
  );
});

test('a full spool (the bound the cli-proxy recorded) on a host never enrolled: a warning with the count dropped; nothing stale', async (tt) => {
  const fx = buildFixture(ids);
  writeOwned(join(fx.audit, 'spool.json'), JSON.stringify({ maxEvents: 4 }), 0o640, ids.ac, ids.renew);
  writeOwned(join(fx.audit, 'dropped.json'), JSON.stringify({ dropped: 17 }), 0o640, ids.ac, ids.renew);
  spoolEvents(fx, 3, 2 * HOUR);
  const below = await doctor(baseArgs(fx));
  tt.same(auditFindings(below.findings).filter((f) => f.level !== 'ok'), [], 'one below the bound, two hours old, not enrolled: no warning');
  tt.ok(auditFindings(below.findings).some((f) => f.level === 'ok' && /3 event\(s\) waiting of at most 4, 17 dropped so far.*not enrolled: nothing uploads them/.test(f.detail)), 'the ok line counts them');

  spoolEvents(fx, 1, HOUR);
  const run = await doctor(baseArgs(fx));
  tt.equal(run.code, 0, 'a warning, not a problem: exit 0');
  const full = auditFindings(run.findings).filter((f) => f.level === 'warn');
  tt.equal(full.length, 1, `one warning (got ${JSON.stringify(full)})`);
  tt.equal(full[0]?.code, 'audit_spool_full');
  tt.match(full[0]?.detail ?? '', /the spool is full: 4 event\(s\) waiting of at most 4, 17 dropped so far.*the host is not enrolled/);
  tt.match(full[0]?.fix ?? '', /--no-audit/);
});

interface EnrolledHost {
  fx: Fixture;
  credentialPath: string;
}

/** The fixture as `enroll` leaves it: the credential (0600) and link.env beside it. */
function enrolledHost(): EnrolledHost {
  const fx = buildFixture(ids);
  const etc = join(fx.base, 'etc');
  mkdirSync(etc);
  const credentialPath = join(etc, 'host-credential');
  writeToken(credentialPath, `cred-doctor-audit-${++counter}-V8m2`);
  writeFileSync(join(etc, 'link.env'), 'AGENT_CONNECTORS_GATEWAY_URL=https://gateway.example\nAGENT_CONNECTORS_HOST_ID=host-doctor-audit\n');
  return { fx, credentialPath };
}

function linkStatus(fx: Fixture, pid: number, state: LinkStatus['state'], lastError: LinkStatus['lastError'] = null): void {
  const at = new Date(Date.now() - HOUR).toISOString();
  const status: LinkStatus = { pid, state, since: at, updatedAt: at, lastSyncAt: state === 'polling' ? at : null, receivedVersion: null, lastError };
  writeOwned(join(fx.handoff, 'link-status.json'), JSON.stringify(status), 0o640, ids.ac, ids.renew);
}

/** A pid that ran and is gone. */
function deadPid(): number {
  const r = spawnSync('true');
  if (r.pid === undefined) throw new Error('no pid');
  return r.pid;
}

test('an enrolled host whose events wait and whose last upload is old: a warning naming why, from the link status', async (tt) => {
  const common = { forwarderUrl: fwd?.base ?? '', cliProxyUrl: proxy?.base ?? '', systemd: false };
  const cases: Array<[string, (fx: Fixture) => void, RegExp, RegExp]> = [
    ['no link status', () => undefined, /the link has not reported its state/, /systemctl restart agent-connectors-link/],
    ['a dead link', (fx) => linkStatus(fx, deadPid(), 'polling'), /the link \(pid \d+\) is not running/, /systemctl restart agent-connectors-link/],
    ['Gateway failing', (fx) => linkStatus(fx, process.pid, 'backing_off', { code: 'gateway_unavailable', detail: 'status 503', at: new Date().toISOString() }), /the Gateway is failing the link .*last error gateway_unavailable/, /^journalctl -u agent-connectors-link/],
    ['halted', (fx) => linkStatus(fx, process.pid, 'halted'), /the link is halted: the Gateway refused the host credential/, /^journalctl /],
    ['polling', (fx) => linkStatus(fx, process.pid, 'polling'), /the link reaches the Gateway, so its audit uploads fail or it runs with --no-audit/, /-g 'audit upload'$/],
  ];
  for (const [what, setLink, cause, fix] of cases) {
    const { fx, credentialPath } = enrolledHost();
    setLink(fx);
    spoolEvents(fx, 2, 30 * 60_000);
    writeOwned(join(fx.audit, 'upload.json'), JSON.stringify({ lastUploadAt: new Date(Date.now() - 45 * 60_000).toISOString(), lastAccepted: 3 }), 0o640, ids.ac, ids.renew);
    const findings = await runDoctor({ ...common, stateDir: fx.stateDir, handoffDir: fx.handoff, credentialPath });
    const stale = auditFindings(findings).filter((f) => f.level === 'warn');
    tt.equal(stale.length, 1, `${what}: one warning (got ${JSON.stringify(auditFindings(findings))})`);
    tt.equal(stale[0]?.code, 'audit_upload_stale', `${what}: its code`);
    tt.match(stale[0]?.detail ?? '', /events are not reaching the Gateway: the oldest waits since .* \(30 min ago\); 2 event\(s\) waiting .*last upload accepted .* \(45 min ago\)/, `${what}: ages`);
    tt.match(stale[0]?.detail ?? '', cause, `${what}: the cause`);
    tt.match(stale[0]?.fix ?? '', fix, `${what}: the fix`);
  }
});

test('an enrolled host: a recent upload, or events younger than the threshold, is no warning; the JSON report carries the code', async (tt) => {
  const common = { forwarderUrl: fwd?.base ?? '', cliProxyUrl: proxy?.base ?? '', systemd: false };
  const { fx, credentialPath } = enrolledHost();
  linkStatus(fx, process.pid, 'backing_off', { code: 'network', detail: 'ECONNREFUSED', at: new Date().toISOString() });
  spoolEvents(fx, 5, 3 * 60_000);
  const young = await runDoctor({ ...common, stateDir: fx.stateDir, handoffDir: fx.handoff, credentialPath });
  tt.same(auditFindings(young).filter((f) => f.level !== 'ok'), [], 'events 3 min old: the link may still be retrying');

  spoolEvents(fx, 1, 40 * 60_000);
  writeOwned(join(fx.audit, 'upload.json'), JSON.stringify({ lastUploadAt: new Date(Date.now() - 60_000).toISOString(), lastAccepted: 500 }), 0o640, ids.ac, ids.renew);
  const draining = await runDoctor({ ...common, stateDir: fx.stateDir, handoffDir: fx.handoff, credentialPath });
  tt.same(auditFindings(draining).filter((f) => f.level !== 'ok'), [], 'an old event but an upload a minute ago: a backlog draining');

  rmSync(join(fx.audit, 'upload.json'));
  const run = await doctor(baseArgs(fx).map((a) => (a === join(fx.base, 'host-credential') ? credentialPath : a)));
  const warn = run.findings.find((f) => f.check === 'audit' && f.level === 'warn');
  tt.equal(warn?.code, 'audit_upload_stale', `never uploaded, the oldest 40 min old (got ${JSON.stringify(auditFindings(run.findings))})`);
  tt.match(warn?.detail ?? '', /no upload accepted yet: the Gateway is failing the link/);
  tt.match(run.stdout, /"warnings": \[[^\]]*"audit_upload_stale"/, 'in the summary of warnings');
});

test('doctor never prints a token', async (tt) => {
  tt.ok(doctorOutput.length > 0);
  tt.same(leakedSecrets(doctorOutput.join('\n')), [], 'no known token in any doctor output');
});

if (isRoot) checkNoLeaks(t);
