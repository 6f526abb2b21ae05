import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, renameSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { TapTest } from './tap.js';
import { Wakeups } from './wakeups.js';

/** Tests run compiled from build/test/support, three levels below the repository. */
export const REPO_ROOT = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../..');
export const CLI = join(REPO_ROOT, 'dist/cli.js');

export interface LogLine {
  msg?: string;
  level?: string;
  [k: string]: unknown;
}

/** Every token any test wrote, so every log line and response can be searched for them. */
export const knownSecrets = new Set<string>();

/** Writes a token file the way renewal would (0600), and remembers the secret. */
export function writeToken(path: string, token: string, raw = false): void {
  if (token.trim()) knownSecrets.add(token.trim());
  writeFileSync(path, raw ? token : `${token}\n`, { mode: 0o600 });
  chmodSync(path, 0o600);
}

/**
 * Writes a JSON config (registry, catalog; a string is written as is) the way an
 * operator's tooling would: temp file, then rename into place, which the watcher must see.
 */
export function writeJsonAtomic(path: string, value: unknown): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, typeof value === 'string' ? value : JSON.stringify(value, null, 2), { mode: 0o600 });
  renameSync(tmp, path);
}

export type Exit = { code: number | null; signal: NodeJS.Signals | null };

/** A running CLI process whose pino stdout is collected line by line. */
export class CliProc {
  readonly lines: string[] = [];
  readonly logs: LogLine[] = [];
  readonly stderr: string[] = [];
  private readonly arrivals = new Wakeups();
  readonly exited: Promise<Exit>;

  constructor(readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.lines.push(line);
      try {
        this.logs.push(JSON.parse(line) as LogLine);
      } catch {
        this.logs.push({ msg: line });
      }
      this.arrivals.wake();
    });
    createInterface({ input: child.stderr! }).on('line', (line) => {
      this.lines.push(line);
      this.stderr.push(line);
      this.arrivals.wake();
    });
    this.exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  }

  /** Waits for a log line matching `pred`, looking first at the lines from index `from` on. */
  async waitForLog(pred: (l: LogLine) => boolean, timeoutMs = 10_000, from = 0): Promise<LogLine> {
    let idx = from;
    return this.arrivals.until(
      () => {
        for (; idx < this.logs.length; idx++) if (pred(this.logs[idx] as LogLine)) return this.logs[idx];
        return undefined;
      },
      timeoutMs,
      () => this.timedOut(),
    );
  }

  /** Waits for a stderr line matching `re` (the human output of `dev`, usage errors), from line `from` of `stderr` on. */
  async waitForStderr(re: RegExp, timeoutMs = 10_000, from = 0): Promise<RegExpExecArray> {
    let idx = from;
    return this.arrivals.until(
      () => {
        for (; idx < this.stderr.length; idx++) {
          const m = re.exec(this.stderr[idx] as string);
          if (m) return m;
        }
        return undefined;
      },
      timeoutMs,
      () => this.timedOut(),
    );
  }

  /** Log lines from index `from` on (for "what did this request log"). */
  since(from: number): LogLine[] {
    return this.logs.slice(from);
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<Exit> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill(signal);
    return this.exited;
  }

  private timedOut(): string {
    return `timed out waiting for a line; saw:\n${this.lines.slice(-20).join('\n')}`;
  }
}

/** Waits for a log line printed at or after index `mark` of `proc.logs`. */
export function waitForLogAfter(proc: CliProc, mark: number, pred: (l: LogLine) => boolean, timeoutMs = 10_000): Promise<LogLine> {
  return proc.waitForLog(pred, timeoutMs, mark);
}

/** Every process started here; the leak check greps their output at the end. */
export const allProcs: CliProc[] = [];

/** Starts the built CLI (not under systemd: NOTIFY_SOCKET cleared unless `env` sets it). */
export function startCli(args: string[], env: NodeJS.ProcessEnv = {}): CliProc {
  // `env -u NODE_OPTIONS`: tap's spawn hook puts its loaders into every child's
  // NODE_OPTIONS, which doubles a CLI's start-up; the product needs none of them.
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, CLI, ...args], {
    env: { ...process.env, NOTIFY_SOCKET: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const proc = new CliProc(child);
  allProcs.push(proc);
  return proc;
}

/** The known secrets that `text` contains. */
export function leakedSecrets(text: string): string[] {
  return [...knownSecrets].filter((s) => text.includes(s));
}

/**
 * Registers the last subtest of a file: every line every process of this file printed
 * (stdout and stderr, all levels) is searched for every token the file wrote.
 */
export function checkNoLeaks(t: TapTest): void {
  t.test('no token appears in any log line of this file', async (tt) => {
    await Promise.all(allProcs.map((p) => p.stop('SIGTERM')));
    tt.ok(knownSecrets.size > 0, 'the file wrote tokens to look for');
    tt.ok(allProcs.length > 0, 'the file ran processes');
    const all = allProcs.flatMap((p) => p.lines).join('\n');
    tt.same(leakedSecrets(all), [], 'no known token in any line');
  });
}
