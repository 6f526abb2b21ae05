import { spawn } from 'node:child_process';

export interface CappedResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
  timedOut: boolean;
}

export interface CappedOptions {
  env: Record<string, string>;
  cwd?: string;
  timeoutMs: number;
  input?: string;
}

/** At most this much of a command's output is kept: enough for any verdict and its reason. */
const OUTPUT_CAP = 4 * 1024 * 1024;

/**
 * Runs one agent command in a process group of its own and kills the whole group when it
 * ends or times out: agents leave helpers behind (MCP children, update checkers), and a
 * release gate must not leave anything running on the machine.
 */
export function runCapped(file: string, args: readonly string[], opts: CappedOptions): Promise<CappedResult> {
  return new Promise((resolve) => {
    const child = spawn(file, args, {
      env: opts.env,
      cwd: opts.cwd ?? '/',
      detached: true,
      stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
    });
    const chunks: Buffer[] = [];
    let size = 0;
    const keep = (b: Buffer): void => {
      if (size >= OUTPUT_CAP) return;
      chunks.push(b);
      size += b.length;
    };
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    if (opts.input !== undefined) child.stdin!.end(opts.input);
    let timedOut = false;
    const killGroup = (): void => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // the group is gone already
      }
    };
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, opts.timeoutMs);
    child.once('error', (err) => {
      clearTimeout(timer);
      resolve({ code: null, signal: null, output: `cannot start ${file}: ${err.message}`, timedOut: false });
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      killGroup();
      resolve({ code, signal, output: Buffer.concat(chunks).toString('utf8'), timedOut });
    });
  });
}

/** One line of an output, for a verdict's reason. */
export function brief(text: string, max = 200): string {
  const line = text.replace(/\x1b\[[0-9;]*m/g, '').replace(/\s+/g, ' ').trim();
  return line.length > max ? `${line.slice(0, max)}…` : line;
}
