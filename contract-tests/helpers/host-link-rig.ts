import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { allProcs, CLI, CliProc, knownSecrets, startCli, type Exit, type LogLine } from '../../test/support/cli-proc.js';
import { MockHostGateway, type MockHostGatewayOptions } from '../../test/support/mock-host-gateway.js';
import { within } from '../../test/support/poll.js';
import { startProxy, type ProxyProc } from '../../test/support/proxy-rig.js';
import type { TapTest } from '../../test/support/tap.js';
import { tempDir } from '../../test/support/temp-dir.js';

/**
 * A whole enrolled host, black-box (SPEC §8): a MockHostGateway; `enroll` with the pairing
 * code on stdin; `link` started the way its unit starts it (link.env as its environment,
 * the credential by path); `renew apply --watch`; optionally a forwarder and a cli-proxy.
 * The link and apply have separate state roots sharing one hand-off directory, as on a
 * host. Every token the Gateway mints becomes a known secret (the leak checks search for
 * them) and is remembered per slot, so a test can grep the disk for a dropped slot's tokens.
 */

export const APPLIED = 'desired state applied';
export const HANDED_OVER = 'desired state handed over to apply';

export interface HostWorld {
  gw: MockHostGateway;
  root: string;
  credential: string;
  handoff: string;
  linkState: string;
  applyState: string;
  shimDir: string;
  /** Every token the Gateway minted, by slot. */
  minted: Map<string, Set<string>>;
  /** The pairing codes used (secrets too). */
  codes: string[];
  fwd: ProxyProc | undefined;
  cli: ProxyProc | undefined;
  /** AGENT_CONNECTORS_GATEWAY_URL and _HOST_ID, from the link.env enroll wrote. */
  linkEnv: Record<string, string>;
  instanceToken: (id: string) => string;
  providerToken: (name: string) => string;
  /** `unit`: link.env as the environment, as the unit loads it; `credential-only`: nothing but the files enroll wrote. */
  startLink: (env?: NodeJS.ProcessEnv, how?: 'unit' | 'credential-only', extraArgs?: string[]) => CliProc;
  startApply: (env?: NodeJS.ProcessEnv) => CliProc;
}

export interface HostWorldOptions extends MockHostGatewayOptions {
  /** Start a forwarder and a cli-proxy on apply's state root. */
  proxies?: boolean;
  /** The /healthz URL the link asks for the forwarder's health (default: the forwarder's, or a closed port). */
  forwarderHealth?: string;
}

/** Runs `enroll` with the code on stdin (no systemd: the test starts the link itself). */
export async function enroll(gw: MockHostGateway, credential: string, code: string, extra: string[] = []): Promise<CliProc> {
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, CLI, 'enroll', '--gateway', gw.url, '--credential', credential, ...extra], {
    env: { ...process.env, NOTIFY_SOCKET: '', AGENT_CONNECTORS_TEST_HOOKS: 'systemd:absent' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const proc = new CliProc(child);
  allProcs.push(proc);
  child.stdin.end(`${code}\n`);
  const exit = await within(proc.exited, 20_000, 'enroll');
  if (exit.code !== 0) throw new Error(`enroll failed (${exit.code ?? exit.signal}):\n${proc.lines.join('\n')}`);
  return proc;
}

export function parseEnvFile(path: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const m = /^([A-Z_]+)=(.*)$/.exec(line);
    if (m?.[1] && m[2] !== undefined) out[m[1]] = m[2];
  }
  return out;
}

/** Every token the authority hands out is remembered (per slot) and becomes a known secret. */
function recordMinted(gw: MockHostGateway): Map<string, Set<string>> {
  const minted = new Map<string, Set<string>>();
  const renew = gw.authority.renew.bind(gw.authority);
  gw.authority.renew = (slot, bearer, body) => {
    const result = renew(slot, bearer, body);
    if (result.status === 200 && 'token' in result.body) {
      knownSecrets.add(result.body.token);
      const set = minted.get(slot) ?? new Set<string>();
      set.add(result.body.token);
      minted.set(slot, set);
    }
    return result;
  };
  return minted;
}

export async function hostWorld(t: TapTest, options: HostWorldOptions = {}): Promise<HostWorld> {
  const { proxies, forwarderHealth, ...gwOptions } = options;
  const gw = await MockHostGateway.start({ longPollMs: 2_000, ...gwOptions });
  t.teardown(() => gw.close());
  const minted = recordMinted(gw);
  const root = tempDir('ac-hostlink-', t);
  const credential = join(root, 'etc', 'host-credential');
  const handoff = join(root, 'handoff');
  const linkState = join(root, 'link');
  const applyState = join(root, 'apply');
  const shimDir = join(root, 'shims');
  // What the installer creates; everything inside comes from the link and apply.
  for (const d of ['slots', 'inbox']) mkdirSync(join(handoff, d), { recursive: true });

  const fwd = proxies ? await startProxy(t, 'forwarder', { stateDir: applyState }) : undefined;
  const cli = proxies ? await startProxy(t, 'cli-proxy', { stateDir: applyState }) : undefined;

  const code = gw.control.issuePairingCode();
  knownSecrets.add(code);
  await enroll(gw, credential, code);
  knownSecrets.add(readFileSync(credential, 'utf8').trim());
  const linkEnv = parseEnvFile(join(root, 'etc', 'link.env'));

  const closedHealth = 'http://127.0.0.1:9/healthz';
  const startLink = (env: NodeJS.ProcessEnv = {}, how: 'unit' | 'credential-only' = 'unit', extraArgs: string[] = []): CliProc => {
    const proc = startCli(
      [
        'link',
        '--credential', credential,
        '--handoff', handoff,
        '--state-dir', linkState,
        '--link-backoff-base-ms', '50',
        '--link-backoff-cap-ms', '400',
        '--poll-timeout-ms', '5000',
        '--credential-recheck-ms', '200',
        '--presence-interval-ms', '2000',
        '--backoff-cap-ms', '1000',
        '--forwarder-health', forwarderHealth ?? (fwd ? `${fwd.base}/healthz` : closedHealth),
        '--cli-proxy-health', cli ? `${cli.base}/healthz` : closedHealth,
        '--log-level', 'trace',
        ...extraArgs,
      ],
      // As the unit loads it: link.env is an EnvironmentFile, the credential a path.
      how === 'unit' ? { ...linkEnv, ...env } : env,
    );
    t.teardown(() => proc.stop('SIGKILL'));
    return proc;
  };
  const startApply = (env: NodeJS.ProcessEnv = {}): CliProc => {
    const proc = startCli(
      ['renew', 'apply', '--watch', '--handoff', handoff, '--state-dir', applyState, '--shim-dir', shimDir, '--proxy-url', cli?.base ?? 'http://127.0.0.1:14324', '--log-level', 'trace'],
      env,
    );
    t.teardown(() => proc.stop('SIGKILL'));
    return proc;
  };
  return {
    gw,
    root,
    credential,
    handoff,
    linkState,
    applyState,
    shimDir,
    minted,
    codes: [code],
    fwd,
    cli,
    linkEnv,
    instanceToken: (id) => join(applyState, 'mcp-forwarder', `${id}.token`),
    providerToken: (name) => join(applyState, 'cli-proxy', `${name}.token`),
    startLink,
    startApply,
  };
}

export const appliedLine = (v: number) => (l: LogLine) => l.msg === APPLIED && l.version === v;

/** Every regular file under `dir`, recursively (a file gone while walking is skipped). */
export function filesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return [];
  }
  return entries.flatMap((e) => {
    const p = join(dir, e.name);
    return e.isDirectory() ? filesUnder(p) : e.isFile() ? [p] : [];
  });
}

/** The files under `dir` whose text contains any of `needles`. */
export function filesHolding(dir: string, needles: Iterable<string>): string[] {
  const list = [...needles];
  return filesUnder(dir).filter((f) => {
    let text: string;
    try {
      text = readFileSync(f, 'utf8');
    } catch {
      return false;
    }
    return list.some((n) => text.includes(n));
  });
}

export function readJson(path: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
}

export function modeOf(path: string): number {
  return statSync(path).mode & 0o777;
}

export async function killedAt(proc: CliProc, what: string): Promise<Exit> {
  return within(proc.exited, 20_000, what);
}
