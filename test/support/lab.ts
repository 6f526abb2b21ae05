import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, unlinkSync, watch, writeFileSync, writeSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { execa } from 'execa';
import { processAlive } from '../../src/fs/process-alive.js';
import { REPO_ROOT } from './cli-proc.js';
import { Wakeups } from './wakeups.js';

/**
 * The project's systemd lab (`test/tools/systemd-lab.sh`, see docs/testing.md): a
 * throw-away systemd booted as PID 1 of private namespaces. These helpers boot it once,
 * keep it up while a test drives it step by step through `nsenter` (the same way the lab
 * script runs its own command), and tear it down.
 */
export const TOOLS_DIR = join(REPO_ROOT, 'test/tools');
export const LAB_SCRIPT = join(TOOLS_DIR, 'systemd-lab.sh');
export const VERIFY_UNITS = join(TOOLS_DIR, 'verify-units.sh');

/** The units' fixed loopback ports (shared with the host: the lab shares its network). */
export const FORWARDER_PORT = 14323;
export const CLI_PROXY_PORT = 14324;

/** A PATH that finds every tool inside the lab and on the host, and nothing of the test runner's. */
const CLEAN_ENV: Record<string, string> = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LANG: 'C.UTF-8' };

export interface RunResult {
  code: number | undefined;
  stdout: string;
  stderr: string;
  timedOut: boolean;
}

/**
 * `env -i` and the given variables, then `file`: tap's spawn hooks add NODE_OPTIONS (a
 * loader inside the checkout) to whatever environment a child is given, and a node started
 * inside the lab, where the checkout may be hidden under its private /tmp, would die on it.
 */
function cleanCommand(file: string, args: readonly string[], env: Record<string, string | undefined> = {}): [string, string[]] {
  const pairs = Object.entries({ ...CLEAN_ENV, ...env }).map(([k, v]) => `${k}=${v ?? ''}`);
  return ['/usr/bin/env', ['-i', ...pairs, file, ...args]];
}

/** Runs a host command to the end with a clean environment; never throws for a non-zero exit. */
export async function run(file: string, args: readonly string[], opts: { env?: Record<string, string>; timeoutMs?: number; cwd?: string } = {}): Promise<RunResult> {
  const [envFile, envArgs] = cleanCommand(file, args, opts.env);
  const r = await execa(envFile, envArgs, {
    env: {},
    extendEnv: false,
    reject: false,
    stdin: 'ignore',
    timeout: opts.timeoutMs ?? 60_000,
    cwd: opts.cwd ?? REPO_ROOT,
    stripFinalNewline: false,
  });
  return { code: r.exitCode, stdout: String(r.stdout), stderr: String(r.stderr), timedOut: Boolean(r.timedOut) };
}

/** The first of `commands` not found in the clean PATH, if any. */
function missingCommand(commands: readonly string[]): string | undefined {
  const dirs = CLEAN_ENV.PATH!.split(':');
  return commands.find((c) => !dirs.some((d) => existsSync(join(d, c))));
}

/** Why the lab cannot run here, or undefined when it can. */
export function labSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'the systemd lab needs root (CI runs as root)';
  if (!existsSync('/lib/systemd/systemd')) return 'the systemd lab needs systemd installed (/lib/systemd/systemd; Debian: apt-get install systemd)';
  const tool = missingCommand(['unshare', 'nsenter', 'script', 'timeout', 'systemctl', 'journalctl', 'systemd-sysusers', 'setpriv', 'curl']);
  if (tool) return `the systemd lab needs ${tool}, which is not installed (.ci/run lists the packages)`;
  return undefined;
}

/** Why `systemd-analyze` checks cannot run here, or undefined when they can. */
export function verifySkipReason(): string | undefined {
  if (missingCommand(['systemd-analyze'])) return 'systemd-analyze is not installed (Debian: apt-get install systemd)';
  return undefined;
}

/** True when nothing listens on 127.0.0.1:port (checked by binding it for a moment). */
export async function portFree(port: number): Promise<boolean> {
  return new Promise((done) => {
    const srv = createServer();
    srv.once('error', () => done(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => done(true)));
  });
}

export interface SystemUser {
  name: string;
  uid: number;
  gid: number;
}

/** uid/gid of a user, or undefined if there is none. */
export async function lookupUser(name: string): Promise<SystemUser | undefined> {
  const u = await run('id', ['-u', name]);
  const g = await run('id', ['-g', name]);
  if (u.code !== 0 || g.code !== 0) return undefined;
  return { name, uid: Number(u.stdout.trim()), gid: Number(g.stdout.trim()) };
}

export async function groupId(name: string): Promise<number | undefined> {
  const r = await run('getent', ['group', name]);
  if (r.code !== 0) return undefined;
  const gid = Number(r.stdout.split(':')[2]);
  return Number.isInteger(gid) ? gid : undefined;
}

/**
 * A system user with no home and no shell, created if missing and deliberately left in
 * place (creating is idempotent; removing one while a parallel test file still uses it
 * would be racy, and an account without a shell or home grants nothing).
 */
export async function ensureSystemUser(name: string): Promise<SystemUser> {
  const found = await lookupUser(name);
  if (found) return found;
  const r = await run('useradd', ['--system', '--user-group', '--no-create-home', '--shell', '/usr/sbin/nologin', name]);
  const created = await lookupUser(name);
  if (!created) throw new Error(`could not create user ${name}: useradd exited ${r.code}: ${r.stderr}`);
  if (created.uid === 0) throw new Error(`user ${name} has uid 0`);
  return created;
}

/** `systemd-analyze security --offline=true` exposure score of one unit file. */
export async function exposureScore(unitFile: string): Promise<{ score: number | undefined; output: string }> {
  const r = await run('systemd-analyze', ['security', '--offline=true', '--no-pager', unitFile], { env: { SYSTEMD_COLORS: '0' } });
  const output = r.stdout + r.stderr;
  const m = /Overall exposure level for \S+: (\d+(?:\.\d+)?)/.exec(output);
  return { score: m ? Number(m[1]) : undefined, output };
}

export async function systemdVersion(): Promise<string> {
  const r = await run('systemd-analyze', ['--version']);
  return /systemd (\d+)/.exec(r.stdout)?.[1] ?? 'unknown';
}

/** Parses `systemctl show` KEY=VALUE output. */
export function parseShow(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split('\n')) {
    const i = line.indexOf('=');
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1);
  }
  return out;
}

export interface LabOptions {
  /** The units under test (the lab's only unit path). */
  unitDir: string;
  /** Shown inside at appMount (none: the lab installs the app itself, see overlay). */
  appDir?: string;
  appMount?: string;
  /** Writable overlays of the host's /etc, /usr and /var/lib/dpkg (the lab script's LAB_OVERLAY). */
  overlay?: boolean;
  /** Another root file system to boot, as a writable overlay (the lab script's LAB_ROOT). */
  root?: string;
  /** Scratch dir for the lab (stubs, console.log). */
  work: string;
  /** Hard limit for the whole lab, seconds (the lab script runs under `timeout -k 5`). */
  limitS?: number;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * One lab at a time on a machine: every lab serves the units' fixed ports on the shared
 * loopback, so two test files (or two checkouts) booting labs at once would fight over
 * them. The lock file holds the owner's pid; a dead owner's lock is broken.
 */
export const LAB_LOCK = '/tmp/agent-connectors-systemd-lab.lock';
/** Test files that boot a lab raise their tap timeout by this much: they may queue for the lock. */
export const LAB_QUEUE_ALLOWANCE_MS = 15 * 60_000;

async function acquireLabLock(timeoutMs: number): Promise<() => void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const fd = openSync(LAB_LOCK, 'wx', 0o600);
      writeSync(fd, String(process.pid));
      closeSync(fd);
      const release = (): void => {
        process.off('exit', release);
        try {
          if (readFileSync(LAB_LOCK, 'utf8').trim() === String(process.pid)) unlinkSync(LAB_LOCK);
        } catch {
          // already gone
        }
      };
      process.on('exit', release);
      return release;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    let owner = 0;
    try {
      owner = Number(readFileSync(LAB_LOCK, 'utf8').trim());
    } catch {
      continue;
    }
    if (Number.isInteger(owner) && owner > 0 && !processAlive(owner)) {
      try {
        unlinkSync(LAB_LOCK);
      } catch {
        // someone else broke it first
      }
      continue;
    }
    if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for the systemd lab lock ${LAB_LOCK} (held by pid ${owner || 'unknown'})`);
    await sleep(250);
  }
}

/**
 * One booted lab. Its own command only waits for a stop file, so the lab stays up while
 * the test runs commands inside it with `exec` (nsenter into systemd's namespaces).
 */
export class Lab {
  readonly output: string[] = [];
  /**
   * Every script `exec` ran, in order. Each was an argv (`bash -c …`) that any user of the
   * machine can read in /proc, so the secret searches read these too.
   */
  readonly commands: string[] = [];
  readonly exited: Promise<number | null>;
  hostPid = 0;
  private readonly stopFile: string;
  /** Woken by each line of the lab script's output and by its exit. */
  private readonly lines = new Wakeups();

  private constructor(
    readonly opts: LabOptions,
    private readonly child: ChildProcess,
    releaseLock: () => void,
  ) {
    this.stopFile = join(opts.work, 'lab-stop');
    const collect = (line: string): void => {
      this.output.push(line);
      this.lines.wake();
    };
    createInterface({ input: child.stdout! }).on('line', collect);
    createInterface({ input: child.stderr! }).on('line', collect);
    this.exited = new Promise((r) =>
      child.once('exit', (code) => {
        releaseLock();
        this.lines.wake();
        r(code);
      }),
    );
  }

  get consoleLogPath(): string {
    return join(this.opts.work, 'console.log');
  }

  /** systemd's console (its own log; with `systemctl log-level debug`, every state change). */
  consoleLog(): string {
    try {
      return readFileSync(this.consoleLogPath, 'utf8');
    } catch {
      return '';
    }
  }

  /**
   * Waits until systemd's console (from offset `from`, carriage returns removed) matches
   * `pattern` (it reaches the file through a pty, a moment after the event); returns the
   * text either way, for the assertion and its diagnostics.
   */
  async waitConsole(from: number, pattern: RegExp, timeoutMs = 5000): Promise<{ ok: boolean; text: string }> {
    const deadline = Date.now() + timeoutMs;
    const changed = new Wakeups();
    // inotify on the file: each write wakes the check. The one-second re-check is only a
    // backstop should the file be replaced under the watch.
    const watcher = watch(this.consoleLogPath, () => changed.wake());
    try {
      for (;;) {
        const text = this.consoleLog().slice(from).replace(/\r/g, '');
        if (pattern.test(text)) return { ok: true, text };
        if (Date.now() > deadline) return { ok: false, text };
        await changed.next(Math.min(deadline, Date.now() + 1000));
      }
    } finally {
      watcher.close();
    }
  }

  static async boot(opts: LabOptions): Promise<Lab> {
    const releaseLock = await acquireLabLock(LAB_QUEUE_ALLOWANCE_MS - 60_000);
    for (const port of [FORWARDER_PORT, CLI_PROXY_PORT]) {
      let free = await portFree(port);
      for (let i = 0; !free && i < 50; i++) {
        await sleep(200);
        free = await portFree(port);
      }
      if (!free) {
        releaseLock();
        throw new Error(`127.0.0.1:${port} is in use on this host; the lab's units listen on that fixed port, so the lab cannot run. Stop whatever holds it (ss -ltnp 'sport = :${port}').`);
      }
    }
    const stopFile = join(opts.work, 'lab-stop');
    const [file, args] = cleanCommand('timeout', ['-k', '5', String(opts.limitS ?? 170), LAB_SCRIPT, `while [ ! -e '${stopFile}' ]; do sleep 0.2; done`], {
      UNIT_DIR: opts.unitDir,
      APP_DIR: opts.appDir ?? '',
      APP_MOUNT: opts.appMount ?? '',
      LAB_OVERLAY: opts.overlay ? '1' : '',
      LAB_ROOT: opts.root ?? '',
      WORK: opts.work,
      RUN_TIMEOUT: String((opts.limitS ?? 170) - 10),
    });
    let child: ChildProcess;
    try {
      child = spawn(file, args, {
        env: {},
        stdio: ['ignore', 'pipe', 'pipe'],
        cwd: opts.work,
      });
    } catch (err) {
      releaseLock();
      throw err;
    }
    const lab = new Lab(opts, child, releaseLock);
    const deadline = Date.now() + 40_000;
    for (;;) {
      // Checked, then waited on, in one synchronous run: no line can slip in between.
      const line = lab.output.find((l) => l.startsWith('# systemd-lab host-pid='));
      const m = line ? /host-pid=(\d+) state=(\S*)/.exec(line) : null;
      if (m) {
        lab.hostPid = Number(m[1]);
        if (m[2] === 'running' || m[2] === 'degraded') return lab;
        await lab.shutdown();
        throw new Error(`lab systemd is ${m[2]}, not running:\n${lab.output.join('\n')}\n${lab.consoleLog().slice(-4000)}`);
      }
      if (child.exitCode !== null || Date.now() > deadline) {
        child.kill('SIGTERM');
        throw new Error(`the lab did not boot (exit ${child.exitCode}):\n${lab.output.join('\n')}\n${lab.consoleLog().slice(-4000)}`);
      }
      await lab.lines.next(deadline);
    }
  }

  /** Runs a bash script inside the lab (as root, in systemd's pid/mount/cgroup/uts namespaces). */
  async exec(script: string, timeoutMs = 30_000): Promise<RunResult> {
    this.commands.push(script);
    // -r -w: systemd's root and directory, which with `root` are not the host's.
    return run('nsenter', ['-t', String(this.hostPid), '-p', '-m', '-C', '-u', '-r', '-w', '--', '/bin/bash', '-c', script], { timeoutMs, cwd: '/' });
  }

  /** Like exec, but throws with the output when the script fails. */
  async sh(script: string, timeoutMs = 30_000): Promise<string> {
    const r = await this.exec(script, timeoutMs);
    if (r.code !== 0) throw new Error(`lab command failed (${r.timedOut ? 'timed out' : `exit ${r.code}`}): ${script}\n${r.stdout}${r.stderr}`);
    return r.stdout;
  }

  async show(unit: string, props: readonly string[]): Promise<Record<string, string>> {
    return parseShow(await this.sh(`systemctl show -p ${props.join(',')} ${unit}`));
  }

  /**
   * Polls `systemctl show` until `pred` holds; returns the last properties seen. A poll,
   * not an event: systemd announces property changes only on D-Bus, which the lab does not
   * expose to the host. Each probe is two processes (nsenter, systemctl), so the gap grows
   * from 50 ms by half each time up to 1 s: a quick change is seen at once, a slow one
   * (a restart under load) costs a probe a second, not ten.
   */
  async waitShow(unit: string, props: readonly string[], pred: (p: Record<string, string>) => boolean, timeoutMs = 20_000): Promise<Record<string, string>> {
    const deadline = Date.now() + timeoutMs;
    for (let gap = 50; ; gap = Math.min(1000, gap * 1.5)) {
      const p = await this.show(unit, props);
      if (pred(p)) return p;
      if (Date.now() > deadline) throw new Error(`timed out waiting on ${unit}: last ${JSON.stringify(p)}`);
      await sleep(Math.min(gap, Math.max(0, deadline - Date.now())));
    }
  }

  /** The service's stdout in the journal, one message per line. */
  async journal(unit?: string): Promise<string> {
    const r = await this.exec(`journalctl --no-pager -o cat ${unit ? `-u ${unit}` : ''}`);
    return r.stdout;
  }

  /**
   * Follows the journal of `unit` (every line so far, then each as journald stores it)
   * until a line satisfies `pred`. `timeout` inside the lab bounds journalctl itself: once
   * we stop reading, it would otherwise live until its next write hit the closed pipe.
   */
  async waitJournal(unit: string, pred: (line: string) => boolean, timeoutMs = 20_000): Promise<string> {
    const [file, args] = cleanCommand('nsenter', [
      '-t', String(this.hostPid), '-p', '-m', '-C', '-u', '-r', '-w', '--',
      'timeout', String(Math.ceil(timeoutMs / 1000) + 5), 'journalctl', '--no-pager', '-o', 'cat', '--lines=all', '--follow', '-u', unit,
    ]);
    const child = spawn(file, args, { env: {}, stdio: ['ignore', 'pipe', 'ignore'], cwd: '/' });
    const follow = createInterface({ input: child.stdout });
    try {
      return await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`timed out waiting for a journal line of ${unit}`)), timeoutMs);
        follow.on('line', (line) => {
          if (!pred(line)) return;
          clearTimeout(timer);
          resolve(line);
        });
        // 'close', not the child's 'exit': every line already read is seen before giving up.
        follow.once('close', () => {
          clearTimeout(timer);
          reject(new Error(`journalctl --follow -u ${unit} ended (exit ${String(child.exitCode)}) before a matching line`));
        });
      });
    } finally {
      follow.close();
      child.stdout.destroy();
      child.kill('SIGTERM');
    }
  }

  /** Ends the lab's own command, waits for the teardown; kills the lab if it hangs. */
  async shutdown(): Promise<number | null> {
    writeFileSync(this.stopFile, '');
    const code = await Promise.race([this.exited, sleep(20_000).then(() => 'hung' as const)]);
    if (code !== 'hung') return code;
    // `timeout` passes SIGTERM on to the lab script, whose EXIT trap kills the lab's systemd.
    this.child.kill('SIGTERM');
    return this.exited;
  }
}
