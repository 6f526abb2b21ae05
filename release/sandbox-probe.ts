import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { brief, runCapped, type CappedResult } from './capped.js';
import { outcome, type Verdict } from './probes.js';

export const CODEX_SANDBOX = 'codex-sandbox';

export interface SandboxProbeContext {
  codex: string;
  /** `shims path --agent codex` as the target prints it. */
  shimsPath: () => Promise<string>;
  /** A shimmed command, the PATH prefix (shim directory first) it runs with, and what it prints when the cli-proxy served it. */
  shim: { pathPrefix: string; argv: readonly string[]; served: RegExp };
  work: string;
  timeoutMs: number;
}

/** The `-c '…'` words of the printed Codex command line, quotes removed, as Codex gets them from a shell. */
export function codexOverrides(printed: string): string[] {
  const line = printed.split('\n').find((l) => /(^|\s)codex(\s|$)/.test(l) && !l.startsWith('#')) ?? '';
  return [...line.replace(/#.*$/, '').matchAll(/-c '([^']*)'/g)].map((m) => m[1]!);
}

/**
 * Codex's sandbox runs a shimmed CLI without a model (`codex sandbox -- <shim>`): with the
 * overrides `shims path --agent codex` prints, the CLI reaches the cli-proxy through its
 * shim; without them Codex's default sandbox keeps the network off and the same call must
 * fail, or the check proves nothing.
 */
export async function probeCodexSandbox(ctx: SandboxProbeContext): Promise<Verdict> {
  const client = CODEX_SANDBOX;
  const home = join(ctx.work, client, 'home');
  const codexHome = join(home, '.codex');
  const tmp = join(ctx.work, client, 'tmp');
  mkdirSync(codexHome, { recursive: true });
  mkdirSync(tmp, { recursive: true });
  const printed = await ctx.shimsPath();
  const overrides = codexOverrides(printed);
  const command = printed.split('\n')[0] ?? '';
  if (overrides.length === 0) return { client, ok: false, tools: 0, detail: `shims path --agent codex printed no -c override: ${brief(printed)}`, command, home };
  // The shim's CLI is a Node script: the gate's own Node follows the shim directory.
  const env = { PATH: `${ctx.shim.pathPrefix}:${dirname(process.execPath)}:/usr/local/bin:/usr/bin:/bin`, HOME: home, TMPDIR: tmp, CODEX_HOME: codexHome, RUST_LOG: 'error' };
  // Inside Codex's seccomp sandbox Node cannot write to the socket pairs a spawned child's
  // stdio are (its output vanishes): a shell pipe in between gives it a plain pipe. The
  // pipe hides the exit status, so the verdict reads what the CLI printed.
  const run = (flags: string[]): Promise<CappedResult> =>
    runCapped(ctx.codex, ['sandbox', ...flags.flatMap((o) => ['-c', o]), '--', 'sh', '-c', '"$@" 2>&1 | cat', 'sh', ...ctx.shim.argv], { env, cwd: home, timeoutMs: ctx.timeoutMs });
  const closed = await run([]);
  const open = await run(overrides);
  const shown = `codex sandbox ${overrides.map((o) => `-c '${o}'`).join(' ')} -- ${ctx.shim.argv.join(' ')}`;
  // Without the overrides the call must fail for the network alone (acdemo's fetch cannot connect), not for anything else.
  if (!/fetch failed/.test(closed.output)) {
    return { client, ok: false, tools: 0, detail: `without the overrides: ${outcome(closed)} and no refused connection (the check could not fail): ${brief(closed.output)}`, command: shown, home };
  }
  if (open.code !== 0 || !ctx.shim.served.test(open.output)) return { client, ok: false, tools: 0, detail: `with the printed overrides: ${outcome(open)}: ${brief(open.output)}`, command: shown, home };
  return {
    client,
    ok: true,
    tools: 0,
    detail: `in Codex's sandbox the shim reached the cli-proxy with the printed overrides (${brief(open.output, 120)}); without them: ${brief(closed.output, 80)}`,
    command: shown,
    home,
  };
}
