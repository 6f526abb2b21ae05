import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, request as httpsRequest, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { execa } from 'execa';
import { ensureAgentUser, runAsAgent, snapshotProcsOf, type AgentUser, type ProcSnapshot } from '../test/support/agent-user.js';
import { startCli, type CliProc } from '../test/support/cli-proc.js';
import { issueServerCert, makeTestCa } from '../test/support/test-ca.js';
import { npmInstall } from './agents.js';
import type { CliCase } from './clis/cli-case.js';
import { filesHolding } from './probes.js';

/**
 * The CLI gate (issue 20 item 6): real CLIs, unchanged, installed as their users install
 * them, each run as the agent UID through its shim against a fake of its SaaS under the
 * real host name (cli-proxy `--resolve` and `--upstream-ca`), a fake that answers only the
 * real credential. Afterwards no secret may be in the CLI's home, its output, the shims,
 * the proxy's log, or the argv and environment of any agent process while it ran; and a
 * host outside the catalog must arrive through the proxy untouched.
 *
 * One cli-proxy serves every case, its catalog holding every case's provider: the proxy's
 * start (seconds on a loaded machine) is paid once, and the catalog is proven whole as a
 * host would hold it (TLS mode's rules apply across providers: no host named twice). Cases
 * one catalog cannot hold together (two CLIs of one SaaS naming the same hosts) go to a
 * further cli-proxy of their own (groupsOf). Each case has its own fake (its own
 * certificate and `serve`), its own HOME and its own checks.
 */

export interface CliVerdict {
  name: string;
  version: string;
  mode: string;
  command: string;
  ok: boolean;
  detail: string;
  /** Wall-clock seconds of the case's steps and checks (the machine's load shows in them). */
  seconds: number;
}

export interface CliGateOptions {
  cases: readonly CliCase[];
  /** The gates' cache: npm-installed CLIs go to `<cacheDir>/clis` (pinned, stamped, reused). */
  cacheDir: string;
  log: (line: string) => void;
  /** Per step: a stop for a hung CLI, not a timing check. */
  stepTimeoutMs: number;
  /** Leave the gate's directory behind for a look. */
  keep?: boolean;
}

/** The row that holds the non-catalog tunnel check (runs when a `curl` shim is installed). */
export const TUNNEL_ROW = 'tunnel (non-catalog host)';
const TUNNEL_HOST = 'not-in-catalog.example.net';
const REQUIRED = process.env.AGENT_CONNECTORS_REQUIRE_ALL_TESTS === '1';
const SYSTEM_PATH = '/usr/local/bin:/usr/bin:/bin';

interface Fake {
  server: Server;
  port: number;
  requests: number;
  /** The agent UID's processes, taken while the first requests were at the fake. */
  snapshots: ProcSnapshot[][];
}

/** One https server for `hosts`, its certificate from the gate's test CA. */
async function startFake(pki: string, name: string, hosts: readonly string[], agent: AgentUser, serve: CliCase['serve']): Promise<Fake> {
  const server = createServer(issueServerCert(pki, name, hosts));
  const fake: Fake = { server, port: 0, requests: 0, snapshots: [] };
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      fake.requests++;
      // While a request waits here its CLI is alive: the moment to read its argv and environ.
      if (fake.snapshots.length < 4) fake.snapshots.push(snapshotProcsOf(agent.uid));
      try {
        serve(req, Buffer.concat(chunks), res);
      } catch (err) {
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
        res.end(`fake ${name} failed: ${(err as Error).message}`);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  fake.port = (server.address() as AddressInfo).port;
  return fake;
}

function closeFake(fake: Fake): void {
  fake.server.closeAllConnections();
  fake.server.close();
}

const modeOf = (c: CliCase): string => (c.provider.mode === 'tls' ? 'tls' : 'base-url');

/** The CLI's path on this machine, or why it is not there. */
function binaryOf(c: CliCase, npmDir: string): { bin: string } | { missing: string } {
  if ('apt' in c.install) {
    return existsSync(c.install.bin) ? { bin: c.install.bin } : { missing: `Debian package ${c.install.apt} is not installed (${c.install.bin} missing)` };
  }
  const bin = join(npmDir, 'node_modules/.bin', c.install.bin);
  return existsSync(bin) ? { bin } : { missing: `npm package ${c.install.npm}@${c.install.version} did not install ${bin}` };
}

/** The npm cases' packages, installed once per set of pins (a stamp holds them). */
async function installNpmCases(cases: readonly CliCase[], npmDir: string, log: (line: string) => void): Promise<string | undefined> {
  const pins: Record<string, string> = {};
  for (const c of cases) if ('npm' in c.install) pins[c.install.npm] = c.install.version;
  if (Object.keys(pins).length === 0) return undefined;
  const stamp = join(npmDir, 'installed.json');
  const want = JSON.stringify(Object.fromEntries(Object.entries(pins).sort()));
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === want) return undefined;
  try {
    await npmInstall(npmDir, pins, process.env.PATH ?? SYSTEM_PATH, log);
  } catch (err) {
    return (err as Error).message;
  }
  writeFileSync(stamp, want);
  return undefined;
}

async function versionOf(bin: string, args: readonly string[], path: string): Promise<string> {
  const r = await execa(bin, [...args], { reject: false, timeout: 60_000, env: { PATH: path, HOME: '/nonexistent' }, extendEnv: false, stdin: 'ignore' });
  const line = `${r.stdout}\n${r.stderr}`.split('\n').find((l) => l.trim() !== '');
  if (line === undefined) return `? (exit ${r.exitCode})`;
  // The number alone for the table ("curl 7.88.1 (x86_64…", "aws-cli/2.9.19 Python/…").
  return /\d+\.\d+(?:\.\d+)?(?:[-+.][0-9A-Za-z.]+)?/.exec(line)?.[0] ?? line.trim().slice(0, 40);
}

const secretsIn = (text: string, secrets: readonly string[]): string[] => secrets.filter((s) => s.length > 0 && text.includes(s));

/** Runs the cases; one verdict per case, plus the tunnel row when a `curl` shim is there. */
export async function runCliGate(opts: CliGateOptions): Promise<CliVerdict[]> {
  const { log } = opts;
  if (process.getuid?.() !== 0) {
    const why = 'needs root: creates the agent user and runs each CLI as it with setpriv';
    return [{ name: 'clis', version: '', mode: '', command: '', ok: !REQUIRED, detail: REQUIRED ? `AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1 but ${why}` : `skipped: ${why}`, seconds: 0 }];
  }
  const npmDir = join(opts.cacheDir, 'clis');
  const npmProblem = await installNpmCases(opts.cases, npmDir, log);
  const verdicts = new Map<string, CliVerdict>();
  const runnable: Runnable[] = [];
  const agentPath = (c: CliCase): string => ['npm' in c.install ? `${join(npmDir, 'node_modules/.bin')}:` : '', `${dirname(process.execPath)}:`, SYSTEM_PATH].join('');
  for (const c of opts.cases) {
    const found = binaryOf(c, npmDir);
    if ('missing' in found) {
      const why = npmProblem && 'npm' in c.install ? npmProblem : found.missing;
      // A developer's machine may lack a package; CI installs them all (.ci/run), so there it fails.
      verdicts.set(c.name, { name: c.name, version: '-', mode: modeOf(c), command: c.command, ok: !REQUIRED && !('npm' in c.install), detail: REQUIRED || 'npm' in c.install ? why : `skipped: ${why}`, seconds: 0 });
      continue;
    }
    runnable.push({ c, bin: found.bin, version: await versionOf(found.bin, c.versionArgs, agentPath(c)) });
  }

  const agent = ensureAgentUser();
  // Under the system's temp dir: the agent UID must traverse every parent (the gates' run
  // directory is 0700). It reaches the shims, the CA bundles and its homes; never state/ or pki/.
  const base = mkdtempSync(join(tmpdir(), 'ac-cli-gate-'));
  chmodSync(base, 0o755);
  const pki = join(base, 'pki');
  mkdirSync(pki, { mode: 0o700 });
  makeTestCa(pki, 'agent-connectors CLI gate test CA');
  const testCa = join(base, 'test-ca.pem');
  copyFileSync(join(pki, 'ca.pem'), testCa);
  chmodSync(testCa, 0o644);
  const agentUsers = join(base, 'agent-users');
  writeFileSync(agentUsers, `${agent.name}\n`, { mode: 0o644 });
  // curl is one of the host's own tools: the operator's file allows it, as docs/shims.md says.
  const allowed = join(base, 'allowed-commands');
  writeFileSync(allowed, 'curl\n', { mode: 0o644 });
  const shared: Shared = { agent, base, pki, testCa, agentUsers, allowed, agentPath, log, stepTimeoutMs: opts.stepTimeoutMs };
  const groups = groupsOf(runnable);
  for (const [i, group] of groups.entries()) {
    for (const v of await runGroup(group, i, shared)) verdicts.set(v.name, v);
  }
  if (!opts.keep) rmSync(base, { recursive: true, force: true });
  return [...opts.cases.map((c) => verdicts.get(c.name)!), ...(verdicts.has(TUNNEL_ROW) ? [verdicts.get(TUNNEL_ROW)!] : [])];
}

/** What every group shares: the agent, the test CA, the operator's files. */
interface Shared {
  agent: AgentUser;
  base: string;
  pki: string;
  testCa: string;
  agentUsers: string;
  allowed: string;
  agentPath: (c: CliCase) => string;
  log: (line: string) => void;
  stepTimeoutMs: number;
  tunnelChecked?: boolean;
}

interface Runnable {
  c: CliCase;
  bin: string;
  version: string;
}

/** A `*.` pattern covers one label (SPEC §10); anything else is the name itself. */
function covers(pattern: string, host: string): boolean {
  if (!pattern.startsWith('*.')) return pattern === host;
  const rest = host.slice(0, host.length - pattern.length + 1);
  return host.endsWith(pattern.slice(1)) && rest.length > 0 && !rest.includes('.');
}

function namesOf(c: CliCase): { hosts: string[]; commands: string[] } {
  const hosts = Array.isArray(c.provider.hosts) ? c.provider.hosts.filter((h): h is string => typeof h === 'string') : [];
  const commands = Array.isArray(c.provider.commands) ? c.provider.commands.map((x) => (x as { name?: unknown }).name).filter((n): n is string => typeof n === 'string') : [];
  return { hosts: [...hosts, ...c.hosts].map((h) => h.toLowerCase()), commands };
}

/** Two cases one catalog cannot hold together: a host both name (or cover), a shared command or provider id. */
function clash(a: CliCase, b: CliCase): boolean {
  const x = namesOf(a);
  const y = namesOf(b);
  if (a.providerId === b.providerId || x.commands.some((n) => y.commands.includes(n))) return true;
  return x.hosts.some((h) => y.hosts.some((g) => covers(h, g) || covers(g, h)));
}

/**
 * Cases into groups one catalog can hold (first fit): normally one, but several CLIs of one
 * SaaS (aws, s3cmd, rclone on S3) name the same hosts, and a catalog naming a host twice is
 * refused whole. Each group gets its own cli-proxy.
 */
function groupsOf(cases: readonly Runnable[]): Runnable[][] {
  const groups: Runnable[][] = [];
  for (const r of cases) {
    const fit = groups.find((g) => g.every((o) => !clash(o.c, r.c)));
    if (fit) fit.push(r);
    else groups.push([r]);
  }
  return groups;
}

/** One cli-proxy (its own state, CLI CA, bundle and shims) for a group of cases, then each case. */
async function runGroup(group: readonly Runnable[], index: number, sh: Shared): Promise<CliVerdict[]> {
  const { agent, pki, testCa, log } = sh;
  const state = join(sh.base, `state-${index}`);
  mkdirSync(join(state, 'cli-proxy'), { recursive: true, mode: 0o700 });
  const shimDir = join(sh.base, `shims-${index}`);
  const bundle = join(sh.base, `ca-${index}`, 'ca-bundle.pem');
  const verdicts = new Map<string, CliVerdict>();
  const fakes = new Map<string, Fake>();
  let proxy: CliProc | undefined;
  let tunnelFake: Fake | undefined;
  const tunnelSeen: { rawHeaders: string[]; url: string }[] = [];
  try {
    for (const { c } of group) {
      if (c.setup) {
        const dir = join(pki, `setup-${c.name}`);
        mkdirSync(dir, { mode: 0o700 });
        await c.setup(dir);
      }
      fakes.set(c.name, await startFake(pki, c.name, c.hosts, agent, c.serve.bind(c)));
    }
    tunnelFake = await startFake(pki, `tunnel-${index}`, [TUNNEL_HOST], agent, (req, _body, res) => {
      tunnelSeen.push({ rawHeaders: req.rawHeaders, url: req.url ?? '' });
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(`tunnel-ok ${req.headers['x-gate-probe'] ?? ''}\n`);
    });

    const catalog: Record<string, unknown> = {};
    const resolves: string[] = [`--resolve`, `${TUNNEL_HOST}:443:127.0.0.1:${tunnelFake.port}`];
    for (const { c } of group) {
      const tokenFile = join(state, 'cli-proxy', `${c.providerId}.token`);
      writeFileSync(tokenFile, `${c.token}\n`, { mode: 0o600 });
      catalog[c.providerId] = { ...c.provider, tokenFile };
      for (const h of c.hosts) resolves.push('--resolve', `${h}:443:127.0.0.1:${fakes.get(c.name)!.port}`);
    }
    writeFileSync(join(state, 'cli-proxy', 'providers.json'), JSON.stringify(catalog, null, 2), { mode: 0o600 });
    const started = Date.now();
    proxy = startCli(['cli-proxy', '--listen', '127.0.0.1:0', '--state-dir', state, '--log-level', 'trace', '--agent-users-file', sh.agentUsers, '--ca-bundle', bundle, '--upstream-ca', testCa, ...resolves]);
    const running = proxy;
    const died = running.exited.then(({ code, signal }) => {
      throw new Error(`cli-proxy exited (${code ?? signal}) at start:\n${running.lines.slice(-20).join('\n')}`);
    });
    died.catch(() => undefined);
    // Deadlines, not timing checks: a start took over 20 s on a machine at load 12.
    const listening = await Promise.race([running.waitForLog((l) => l.msg === 'cli-proxy listening', 90_000), died]);
    const loaded = await Promise.race([running.waitForLog((l) => l.msg === 'catalog loaded' || l.msg === 'catalog refused' || l.level === 'error', 30_000), died]);
    if (loaded.msg !== 'catalog loaded' || loaded.providers !== group.length) throw new Error(`the cli-proxy did not load the gate's catalog: ${JSON.stringify(loaded)}`);
    const proxyUrl = `http://127.0.0.1:${listening.port as number}`;
    log(`clis: cli-proxy up with ${group.map(({ c }) => c.providerId).join(', ')} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    const install = startCli(['shims', 'install', '--dir', shimDir, '--proxy-url', proxyUrl, '--state-dir', state, '--ca-bundle', bundle, '--allowed-commands', sh.allowed]);
    const installed = await install.exited;
    if (installed.code !== 0) throw new Error(`shims install exited ${installed.code}: ${install.lines.join('\n')}`);

    for (const { c, bin, version } of group) {
      const verdict = await runCase(c, { bin, version, agent, base: sh.base, shimDir, path: `${shimDir}:${sh.agentPath(c)}`, fake: fakes.get(c.name)!, timeoutMs: sh.stepTimeoutMs, state, testCa });
      verdicts.set(c.name, verdict);
      log(`clis: ${c.name}: ${verdict.ok ? 'ok' : 'FAIL'} (${verdict.seconds.toFixed(1)} s)`);
    }
    // Once per run, in the first group with a curl shim.
    if (!sh.tunnelChecked && existsSync(join(shimDir, 'curl'))) {
      sh.tunnelChecked = true;
      const v = await tunnelCheck({ agent, base: sh.base, shimDir, testCa, fake: tunnelFake, seen: tunnelSeen, proxy: running, secrets: group.flatMap(({ c }) => c.secrets), timeoutMs: sh.stepTimeoutMs }).catch(
        (err: unknown): CliVerdict => ({ name: TUNNEL_ROW, version: '-', mode: 'tls', command: 'curl', ok: false, detail: (err as Error).message, seconds: 0 }),
      );
      verdicts.set(TUNNEL_ROW, v);
      log(`clis: ${TUNNEL_ROW}: ${v.ok ? 'ok' : 'FAIL'}`);
    }
  } catch (err) {
    // The shared part failed (the proxy, the catalog, the shims): every case not yet judged fails with it.
    for (const { c, version } of group) {
      if (!verdicts.has(c.name)) verdicts.set(c.name, { name: c.name, version, mode: modeOf(c), command: c.command, ok: false, detail: (err as Error).message, seconds: 0 });
    }
  } finally {
    await proxy?.stop('SIGTERM');
    for (const f of fakes.values()) closeFake(f);
    if (tunnelFake) closeFake(tunnelFake);
  }
  // The proxy's whole output (trace level: every line it can print), after it stopped.
  const proxyText = proxy ? proxy.lines.join('\n') : '';
  for (const { c } of group) {
    const v = verdicts.get(c.name)!;
    if (secretsIn(proxyText, c.secrets).length > 0) verdicts.set(c.name, { ...v, ok: false, detail: `${v.detail}; SECRET in the cli-proxy's log` });
  }
  return [...verdicts.values()];
}

interface CaseContext {
  bin: string;
  version: string;
  agent: AgentUser;
  base: string;
  shimDir: string;
  path: string;
  fake: Fake;
  timeoutMs: number;
  state: string;
  testCa: string;
}

/** The status the fake gives `GET /` under `host` without any credential. */
function anonymousStatus(port: number, host: string, caFile: string): Promise<number | string> {
  return new Promise((resolve) => {
    const req = httpsRequest({ host: '127.0.0.1', port, servername: host, path: '/', headers: { host }, ca: readFileSync(caFile), timeout: 30_000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 'no status');
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', (err) => resolve(err.message));
    req.end();
  });
}

/** The steps as the agent UID in a fresh HOME, then every place a secret must not be. */
async function runCase(c: CliCase, ctx: CaseContext): Promise<CliVerdict> {
  const started = Date.now();
  const home = join(ctx.base, `home-${c.name}`);
  mkdirSync(home, { mode: 0o700 });
  chownSync(home, ctx.agent.uid, ctx.agent.gid);
  const verdict = (ok: boolean, detail: string): CliVerdict => ({ name: c.name, version: ctx.version, mode: modeOf(c), command: c.command, ok, detail, seconds: (Date.now() - started) / 1000 });
  // A green run proves the injection only if the fake refuses what lacks the credential.
  const anonymous = await anonymousStatus(ctx.fake.port, c.hosts[0]!, ctx.testCa);
  ctx.fake.requests = 0;
  ctx.fake.snapshots = [];
  if (anonymous !== 401 && anonymous !== 403) return verdict(false, `the fake answers a request without the credential with ${anonymous}, not 401/403: it would pass without the injection`);
  const outputs: string[] = [];
  for (const [i, step] of c.steps.entries()) {
    const env = { PATH: ctx.path, HOME: home, LANG: 'C.UTF-8', ...c.env, ...step.env };
    const r = await runAsAgent(ctx.agent, step.script, { env, cwd: home, timeoutMs: ctx.timeoutMs });
    outputs.push(r.stdout, r.stderr);
    const tail = (s: string): string => s.trim().split('\n').slice(-6).join(' | ').slice(0, 600);
    if (r.timedOut) return verdict(false, `step ${i + 1} (${step.script}) timed out after ${ctx.timeoutMs / 1000} s; stderr: ${tail(r.stderr)}`);
    if (r.code !== 0) return verdict(false, `step ${i + 1} (${step.script}) exited ${r.code ?? r.signal}; stderr: ${tail(r.stderr)}; stdout: ${tail(r.stdout)}`);
    if (!step.expect.test(r.stdout)) return verdict(false, `step ${i + 1} (${step.script}): stdout does not match ${String(step.expect)}: ${tail(r.stdout)}`);
  }
  if (ctx.fake.requests === 0) return verdict(false, 'the steps passed but the fake SaaS was never called');
  // The search must be able to fail: the token file holds the token.
  const own = filesHolding(join(ctx.state, 'cli-proxy'), c.secrets);
  if (own.hits.length === 0) return verdict(false, 'self-check: the secret search did not find the token in its own token file');
  const leaks: string[] = [];
  const inHome = filesHolding(home, c.secrets);
  if (inHome.hits.length > 0) leaks.push(`home files ${inHome.hits.join(', ')}`);
  if (secretsIn(outputs.join('\n'), c.secrets).length > 0) leaks.push('the steps\' output');
  const inShims = filesHolding(ctx.shimDir, c.secrets);
  if (inShims.hits.length > 0) leaks.push(`shims ${inShims.hits.join(', ')}`);
  const procs = ctx.fake.snapshots.flat();
  if (procs.length === 0) return verdict(false, 'no agent process was alive while a request was at the fake: argv and environ unchecked');
  const procHits = procs.filter((p) => secretsIn(`${p.cmdline}\n${p.environ}`, c.secrets).length > 0);
  if (procHits.length > 0) leaks.push(`argv/environ of ${procHits.map((p) => `${p.pid} (${p.cmdline.slice(0, 60)})`).join(', ')}`);
  if (leaks.length > 0) return verdict(false, `SECRET in ${leaks.join('; ')}`);
  return verdict(true, `${ctx.fake.requests} requests served with the real credential; no secret in ${inHome.searched} home files, the output, the shims or ${procs.length} agent process snapshots`);
}

/**
 * A host outside the catalog through the curl shim's HTTPS_PROXY: the fake must see curl's
 * own request (its headers exactly, no credential) over its own certificate (curl trusts
 * the test CA alone here, so a leaf minted by the CLI CA would fail the handshake).
 */
async function tunnelCheck(ctx: { agent: AgentUser; base: string; shimDir: string; testCa: string; fake: Fake; seen: { rawHeaders: string[]; url: string }[]; proxy: CliProc; secrets: readonly string[]; timeoutMs: number }): Promise<CliVerdict> {
  const started = Date.now();
  const home = join(ctx.base, 'home-tunnel');
  mkdirSync(home, { mode: 0o700 });
  chownSync(home, ctx.agent.uid, ctx.agent.gid);
  const nonce = randomBytes(8).toString('hex');
  const command = `curl -sS --cacert <test CA> -H 'X-Gate-Probe: <nonce>' https://${TUNNEL_HOST}/probe`;
  const verdict = (ok: boolean, detail: string): CliVerdict => ({ name: TUNNEL_ROW, version: '-', mode: 'tls', command, ok, detail, seconds: (Date.now() - started) / 1000 });
  const mark = ctx.proxy.logs.length;
  const r = await runAsAgent(ctx.agent, 'curl -sS --cacert "$1" -H "X-Gate-Probe: $2" "https://$3/probe"', {
    env: { PATH: `${ctx.shimDir}:${SYSTEM_PATH}`, HOME: home, LANG: 'C.UTF-8' },
    args: [ctx.testCa, nonce, TUNNEL_HOST],
    cwd: home,
    timeoutMs: ctx.timeoutMs,
  });
  if (r.code !== 0) return verdict(false, `curl exited ${r.code ?? r.signal}: ${r.stderr.trim().slice(0, 400)}`);
  if (!r.stdout.includes(`tunnel-ok ${nonce}`)) return verdict(false, `curl got ${r.stdout.slice(0, 200)}`);
  const req = ctx.seen.at(-1);
  if (!req || ctx.seen.length !== 1) return verdict(false, `the non-catalog fake saw ${ctx.seen.length} requests`);
  const names = req.rawHeaders.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase());
  const expected = ['host', 'user-agent', 'accept', 'x-gate-probe'];
  if (names.join(',') !== expected.join(',')) return verdict(false, `the request arrived with headers ${names.join(', ')}, curl sends ${expected.join(', ')}`);
  const raw = req.rawHeaders.join('\n');
  if (secretsIn(raw, ctx.secrets).length > 0) return verdict(false, 'a token was injected into the non-catalog request');
  // Logged when the tunnel closes, after curl has exited.
  const closed = await ctx.proxy.waitForLog((l) => l.msg === 'CONNECT tunnel closed' && l.host === TUNNEL_HOST, 30_000, mark).catch(() => undefined);
  if (!closed) return verdict(false, 'the cli-proxy logged no tunnel to the non-catalog host');
  return verdict(true, `tunnelled byte for byte (${String(closed.bytesIn)} bytes in, ${String(closed.bytesOut)} out): curl's own headers (${names.join(', ')}), no token, the fake's own certificate`);
}
