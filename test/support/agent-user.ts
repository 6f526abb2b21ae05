import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REQUIRE_ALL_TESTS, unlessMissing } from '../tools/prerequisite.js';

/**
 * The unprivileged UID agents run under, as a test creates it (CI runs as root).
 *
 * The user is created once and deliberately left in place afterwards: creation is
 * idempotent (checked with `id` first), parallel test files may share it, and removing a
 * user while another file still runs processes as it would be racy. It owns no home
 * directory and has no login shell, so leaving it behind grants nothing.
 */
export interface AgentUser {
  name: string;
  uid: number;
  gid: number;
}

export const AGENT_USER = 'ac-agent-test';

function lookup(name: string): AgentUser | undefined {
  const u = spawnSync('id', ['-u', name], { encoding: 'utf8' });
  const g = spawnSync('id', ['-g', name], { encoding: 'utf8' });
  if (u.status !== 0 || g.status !== 0) return undefined;
  return { name, uid: Number(u.stdout.trim()), gid: Number(g.stdout.trim()) };
}

/** An existing user (e.g. `nobody`) to run a process as with spawnAsAgent/runAsAgent; throws if there is none. */
export function existingUser(name: string): AgentUser {
  const found = lookup(name);
  if (!found) throw new Error(`there is no user ${name} on this machine`);
  return found;
}

/** Creates the agent user if it does not exist yet (needs root); returns its ids. */
export function ensureAgentUser(name = AGENT_USER): AgentUser {
  const found = lookup(name);
  if (found) return found;
  const r = spawnSync('useradd', ['--system', '--user-group', '--no-create-home', '--shell', '/usr/sbin/nologin', name], {
    encoding: 'utf8',
  });
  // Another test file may have created it in between (useradd exits 9: name in use).
  const created = lookup(name);
  if (!created) throw new Error(`could not create agent user ${name}: useradd exited ${r.status}: ${r.stderr}`);
  if (created.uid === 0) throw new Error(`agent user ${name} has uid 0`);
  return created;
}

export interface AgentRunOptions {
  /** The whole environment of the command: nothing of the test runner's leaks in. */
  env: Record<string, string>;
  cwd?: string;
  /** Positional parameters of the `sh -c` script ($1, $2, …). */
  args?: string[];
  input?: string | Buffer;
  timeoutMs?: number;
}

export interface AgentRunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  pid: number;
}

/** Process groups started here and not yet closed. */
const liveGroups = new Set<ChildProcess>();
let exitHook = false;

/**
 * Starts `sh -c <script>` as the agent UID: real and effective uid/gid switched, no
 * supplementary groups, no inheritable capabilities; non-interactive, no profile. The
 * script leads its own process group, so killGroup() also ends what it started (a
 * command looping through exec survives the death of the `sh -c` that forked it).
 *
 * It starts in `/` (opts.cwd otherwise) with exactly opts.env: the test's own directory
 * and environment point into the checkout, which another user cannot enter when it is
 * cloned somewhere private (a 0700 mktemp -d, anything under /root).
 */
export function spawnAsAgent(user: AgentUser, script: string, opts: AgentRunOptions): ChildProcess {
  if (!exitHook) {
    exitHook = true;
    // A test that dies early (or is timed out by the runner) must not leave a looping
    // shim behind: end every group, then let the signal take its course.
    const killAll = (): void => {
      for (const child of liveGroups) killGroup(child);
    };
    process.once('exit', killAll);
    for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
      process.once(sig, () => {
        killAll();
        process.kill(process.pid, sig);
      });
    }
  }
  // `env -i` first: the test runner's spawn hooks (tap's processinfo adds NODE_OPTIONS and
  // _TAPJS_* variables) must not reach the agent; its environment is exactly opts.env.
  const pairs = Object.entries(opts.env).map(([k, v]) => `${k}=${v}`);
  const child = spawn(
    '/usr/bin/env',
    [
      '-i',
      ...pairs,
      '/usr/bin/setpriv',
      `--reuid=${user.uid}`,
      `--regid=${user.gid}`,
      '--clear-groups',
      '--inh-caps=-all',
      '--',
      '/bin/sh',
      '-c',
      script,
      'sh',
      ...(opts.args ?? []),
    ],
    { env: {}, cwd: opts.cwd ?? '/', stdio: ['pipe', 'pipe', 'pipe'], detached: true },
  );
  liveGroups.add(child);
  child.once('close', () => liveGroups.delete(child));
  return child;
}

/** SIGKILLs the process group spawnAsAgent() made; a no-op when it is already gone. */
export function killGroup(child: ChildProcess): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // ESRCH: nothing left.
  }
}

/** Runs a script as the agent UID to the end (killed after `timeoutMs`, e.g. on a recursion loop). */
export function runAsAgent(user: AgentUser, script: string, opts: AgentRunOptions): Promise<AgentRunResult> {
  const child = spawnAsAgent(user, script, opts);
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout?.on('data', (c: Buffer) => out.push(c));
  child.stderr?.on('data', (c: Buffer) => err.push(c));
  child.stdin?.on('error', () => undefined);
  child.stdin?.end(opts.input ?? '');
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    killGroup(child);
  }, opts.timeoutMs ?? 5_000);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    // Whatever the script left running would hold its pipes open: end it with the script.
    child.once('exit', () => killGroup(child));
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      resolve({
        code,
        signal,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
        timedOut,
        pid: child.pid ?? -1,
      });
    });
  });
}

export interface ProcSnapshot {
  pid: number;
  cmdline: string;
  environ: string;
}

/**
 * cmdline and environment of every live process whose real uid is `uid` (read as root
 * from /proc): what the agent UID could see of its own processes.
 */
export function snapshotProcsOf(uid: number): ProcSnapshot[] {
  const out: ProcSnapshot[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const status = readFileSync(`/proc/${entry}/status`, 'utf8');
      const m = /^Uid:\s+(\d+)/m.exec(status);
      if (!m || Number(m[1]) !== uid) continue;
      out.push({
        pid: Number(entry),
        cmdline: readFileSync(`/proc/${entry}/cmdline`).toString('utf8').split('\0').join(' '),
        environ: readFileSync(`/proc/${entry}/environ`).toString('utf8').split('\0').join('\n'),
      });
    } catch {
      // The process ended while we looked.
    }
  }
  return out;
}

/**
 * A contract file that runs processes as the agent UID: `main` runs as root with the agent
 * user and a 0755 base directory the agent may traverse (removed in teardown); as another
 * user the file is skipped, or fails under AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1.
 */
export async function asRootWithAgent(
  t: { fail(message: string): unknown; plan(n: number, why: string): unknown; teardown(fn: () => void): unknown },
  prefix: string,
  main: (agent: AgentUser, base: string) => Promise<void>,
): Promise<void> {
  if (process.getuid?.() !== 0) {
    const why = 'needs root: creates an agent user and switches to it with setpriv';
    if (REQUIRE_ALL_TESTS) unlessMissing(t, why);
    else t.plan(0, why);
    return;
  }
  const agent = ensureAgentUser();
  const base = mkdtempSync(join(tmpdir(), prefix));
  chmodSync(base, 0o755);
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  await main(agent, base);
}
