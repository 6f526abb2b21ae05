import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { TapTest } from './tap-types.js';

export const REPO_ROOT = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../..');
export const CLI = join(REPO_ROOT, 'dist/cli.js');

export interface LogLine {
  msg?: string;
  level?: string;
  [k: string]: unknown;
}

/** Every token any test wrote, so every log line and response can be searched for them. */
export const knownSecrets = new Set<string>();

export function tempDir(prefix = 'ac-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** Writes a token file the way renewal would (0600), and remembers the secret. */
export function writeToken(path: string, token: string, raw = false): void {
  if (token.trim()) knownSecrets.add(token.trim());
  writeFileSync(path, raw ? token : `${token}\n`, { mode: 0o600 });
  chmodSync(path, 0o600);
}

export function writeInstances(path: string, value: unknown): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, typeof value === 'string' ? value : JSON.stringify(value, null, 2), { mode: 0o600 });
  // Writers rename into place (as bind does); the forwarder must see it.
  renameSync(tmp, path);
}


export interface StartOptions {
  stateDir?: string;
  args?: string[];
  env?: NodeJS.ProcessEnv;
  command?: string[];
}

/** A running CLI process whose pino stdout is collected line by line. */
export class CliProc {
  readonly lines: string[] = [];
  readonly logs: LogLine[] = [];
  readonly stderr: string[] = [];
  private waiters: Array<() => void> = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.lines.push(line);
      try {
        this.logs.push(JSON.parse(line) as LogLine);
      } catch {
        this.logs.push({ msg: line });
      }
      for (const w of this.waiters.splice(0)) w();
    });
    createInterface({ input: child.stderr! }).on('line', (line) => {
      this.lines.push(line);
      this.stderr.push(line);
    });
    this.exited = new Promise((r) => child.once('exit', (code, signal) => r({ code, signal })));
  }

  /** Waits for a log line matching `pred` (looking at lines already seen first). */
  async waitForLog(pred: (l: LogLine) => boolean, timeoutMs = 10_000): Promise<LogLine> {
    const deadline = Date.now() + timeoutMs;
    let idx = 0;
    for (;;) {
      for (; idx < this.logs.length; idx++) {
        const l = this.logs[idx] as LogLine;
        if (pred(l)) return l;
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for log line; saw:\n${this.lines.slice(-20).join('\n')}`);
      await new Promise<void>((r) => {
        const timer = setTimeout(r, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          r();
        });
      });
    }
  }

  /** Log lines after index `from` (for "what did this request log"). */
  since(from: number): LogLine[] {
    return this.logs.slice(from);
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill(signal);
    return this.exited;
  }
}

export interface ForwarderProc extends CliProc {
  port: number;
  base: string;
  stateDir: string;
  instancesPath: string;
}

/** Every process started here; the leak test greps their output at the end. */
export const allProcs: CliProc[] = [];

export function startCli(args: string[], env: NodeJS.ProcessEnv = {}): CliProc {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: { ...process.env, NOTIFY_SOCKET: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const proc = new CliProc(child);
  allProcs.push(proc);
  return proc;
}

export async function startForwarder(t: TapTest, opts: StartOptions = {}): Promise<ForwarderProc> {
  const stateDir = opts.stateDir ?? tempDir();
  mkdirSync(join(stateDir, 'mcp-forwarder'), { recursive: true, mode: 0o700 });
  const proc = startCli(
    ['forwarder', '--listen', '127.0.0.1:0', '--state-dir', stateDir, '--log-level', 'trace', ...(opts.args ?? [])],
    opts.env,
  );
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  const line = await proc.waitForLog((l) => l.msg === 'forwarder listening');
  const port = line.port as number;
  return Object.assign(proc, {
    port,
    base: `http://127.0.0.1:${port}`,
    stateDir,
    instancesPath: join(stateDir, 'mcp-forwarder', 'instances.json'),
  }) as ForwarderProc;
}

/** Text that must not contain any known secret. */
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
