import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startCli, tempDir, writeInstances, type CliProc, type LogLine } from './forwarder-proc.js';
import type { TapTest } from './tap-types.js';

/** A running `agent-connectors cli-proxy` on an ephemeral loopback port. */
export interface CliProxyProc extends CliProc {
  port: number;
  base: string;
  stateDir: string;
  providersPath: string;
}

export interface CliProxyStartOptions {
  stateDir?: string;
  /** Extra CLI arguments (`--body-limit-bytes`, …). */
  args?: string[];
  env?: NodeJS.ProcessEnv;
  /** Written to `<state>/cli-proxy/providers.json` before the process starts. */
  catalog?: unknown;
}

/** `<state>/cli-proxy`, created 0700 like the service's own state directory. */
export function cliProxyDir(stateDir: string): string {
  const dir = join(stateDir, 'cli-proxy');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** Writes providers.json the way an operator's tooling would: temp file, then rename into place. */
export function writeCatalog(path: string, value: unknown): void {
  writeInstances(path, value);
}

/**
 * Starts the cli-proxy at trace level (so the leak check sees every line it can print) and
 * waits for `cli-proxy listening`. Killed at the end of the subtest that started it.
 */
export async function startCliProxy(t: TapTest, opts: CliProxyStartOptions = {}): Promise<CliProxyProc> {
  const stateDir = opts.stateDir ?? tempDir('ac-cli-proxy-');
  const providersPath = join(cliProxyDir(stateDir), 'providers.json');
  if (opts.catalog !== undefined) writeCatalog(providersPath, opts.catalog);
  const proc = startCli(
    ['cli-proxy', '--listen', '127.0.0.1:0', '--state-dir', stateDir, '--log-level', 'trace', ...(opts.args ?? [])],
    opts.env,
  );
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  // A process that dies at startup fails at once, with its output, instead of at the deadline.
  const died = proc.exited.then(({ code, signal }) => {
    throw new Error(`cli-proxy exited (${code ?? signal}) before listening:\n${proc.lines.slice(-20).join('\n')}`);
  });
  died.catch(() => undefined);
  const line = await Promise.race([proc.waitForLog((l) => l.msg === 'cli-proxy listening', 20_000), died]);
  const port = line.port as number;
  return Object.assign(proc, { port, base: `http://127.0.0.1:${port}`, stateDir, providersPath }) as CliProxyProc;
}

/** Waits for a log line printed at or after index `mark` of `proc.logs`. */
export function waitForLogAfter(proc: CliProc, mark: number, pred: (l: LogLine) => boolean, timeoutMs = 10_000): Promise<LogLine> {
  return proc.waitForLog((l) => proc.logs.indexOf(l) >= mark && pred(l), timeoutMs);
}

/** The resident set size of a Linux process, in bytes (from /proc/<pid>/status). */
export function rssBytes(pid: number): number {
  const m = /^VmRSS:\s+(\d+)\s+kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m?.[1]) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}
