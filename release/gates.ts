import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { execa } from 'execa';
import { agentBins, installAgents, type AgentBins } from './agents.js';
import { runCliGate, type CliVerdict } from './cli-gate.js';
import { CLI_CASES } from './clis/index.js';
import { labTargetSkipReason, startLabTarget } from './lab-target.js';
import { eachFile, filesHolding, PROBES, type ProbeContext, type Verdict } from './probes.js';
import { CODEX_SANDBOX, probeCodexSandbox } from './sandbox-probe.js';

/**
 * The release gates (issue 13; the seed's gates 1 and 4): the real agents, installed from
 * npm, each configured with the exact command `mcp-add` prints, in a throw-away home,
 * connect to the product and list its tools; none of their configuration holds a secret.
 * Run by CI after the test suite: `npm run gates`. Not a unit test: it needs the npm
 * registry (once) and takes minutes.
 */

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const CLI = join(REPO_ROOT, 'dist/cli.js');
const SERVER_NAME = 'connectors';

interface Target {
  name: string;
  url: string;
  base: string;
  bindingId: string;
  /** Every secret the target has held so far (tokens, host credential): searched for in each agent's home. */
  secrets: () => string[];
  /** Where the target keeps its tokens: the secret search must find them there, or it is broken. */
  stateDir: string;
  /** `agent-connectors <args>` as the target runs it (dev: this checkout; lab: the installed package). */
  cli: (args: readonly string[]) => Promise<string>;
  /** The tool the gate calls once listed, with arguments its upstream takes. */
  call: { tool: string; args: Record<string, unknown> };
  /** A shimmed CLI the target serves through its cli-proxy (dev's acdemo), for the sandbox gate. */
  shim?: { pathPrefix: string; argv: readonly string[]; served: RegExp; stateDir: string };
  stop: () => Promise<void>;
}

const { values: opts } = parseArgs({
  options: {
    'agents-dir': { type: 'string', default: process.env.AGENT_CONNECTORS_GATES_DIR ?? '/var/tmp/agent-connectors-gates' },
    only: { type: 'string' },
    'timeout-s': { type: 'string', default: '90' },
    report: { type: 'string', default: join(REPO_ROOT, 'build/gates-report.json') },
    keep: { type: 'boolean', default: false },
    targets: { type: 'string', default: 'dev,lab,clis' },
  },
});

const log = (line: string): void => void process.stderr.write(`gates: ${line}\n`);

/** Reads every token file and credential under `dir` (bounded): what must never reach an agent. */
function secretsUnder(dir: string, into: Set<string>): void {
  eachFile(
    dir,
    (path, name) => {
      if (!name.endsWith('.token') && name !== 'host-credential') return;
      try {
        const v = readFileSync(path, 'utf8').trim();
        if (v.length >= 8) into.add(v);
      } catch {
        // deleted between listing and reading: a rotation or a disconnect
      }
    },
    4,
  );
}

/** `agent-connectors dev` in a scratch state dir, on free ports; the URL read off its banner. */
async function startDev(work: string): Promise<Target> {
  const stateDir = join(work, 'dev-state');
  const child: ChildProcess = spawn(process.execPath, [CLI, 'dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--metrics-listen', '127.0.0.1:0'], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work },
    cwd: work,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output: string[] = [];
  createInterface({ input: child.stdout! }).on('line', (l) => output.push(l));
  // The banner names the MCP URL, then the demo CLI's command through its shim.
  let seenUrl: string | undefined;
  const { url, shimPath } = await new Promise<{ url: string; shimPath: string }>((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`dev printed no MCP URL and demo CLI in 60 s:\n${output.join('\n')}`)), 60_000);
    child.once('exit', (code) => reject(new Error(`dev exited (${code}) before it served:\n${output.join('\n')}`)));
    createInterface({ input: child.stderr! }).on('line', (l) => {
      output.push(l);
      seenUrl ??= /MCP URL:\s+(\S+)/.exec(l)?.[1];
      const shim = /PATH=(\S+):\$PATH acdemo whoami/.exec(l);
      if (seenUrl && shim) {
        clearTimeout(timer);
        resolveUrl({ url: seenUrl, shimPath: shim[1]! });
      }
    });
  });
  const held = new Set<string>();
  secretsUnder(stateDir, held);
  // Tokens rotate while the gates run: keep every one the host held.
  const sampler = setInterval(() => secretsUnder(stateDir, held), 250);
  const m = /^(http:\/\/[^/]+)\/i\/([^/]+)\/mcp$/.exec(url);
  if (!m) throw new Error(`dev's MCP URL ${url} is not <base>/i/<bindingId>/mcp`);
  return {
    name: 'dev',
    url,
    base: m[1]!,
    bindingId: m[2]!,
    secrets: () => [...held],
    stateDir,
    cli: cliOut,
    call: { tool: 'echo', args: { message: 'release gate' } },
    // whoami answers with the provider whose token the cli-proxy injected.
    shim: { pathPrefix: shimPath, argv: ['acdemo', 'whoami'], served: /"provider":"demo"/, stateDir },
    stop: async () => {
      clearInterval(sampler);
      secretsUnder(stateDir, held);
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

async function cliOut(args: readonly string[]): Promise<string> {
  const r = await execa(process.execPath, [CLI, ...args], { reject: false, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, extendEnv: false });
  if (r.exitCode !== 0) throw new Error(`agent-connectors ${args.join(' ')}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout.trim();
}

/** A verdict made final: the agent's home searched for every secret the target held, then logged. */
function settle(target: Target, verdict: Verdict, started: number): Verdict {
  let final = verdict;
  if (verdict.home) {
    const found = filesHolding(verdict.home, target.secrets());
    final =
      found.hits.length > 0
        ? { ...verdict, ok: false, detail: `${verdict.detail}; SECRET in ${found.hits.join(', ')}` }
        : { ...verdict, detail: `${verdict.detail}; no secret in its ${found.searched} files` };
  }
  log(`${target.name} ${final.client}: ${final.ok ? `ok ${final.tools} tools` : 'FAIL'} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  return final;
}

async function gateTarget(target: Target, bins: AgentBins, work: string, only: Set<string> | undefined): Promise<Verdict[]> {
  const verdicts: Verdict[] = [];
  const plain = await target.cli(['mcp-add', target.bindingId, '--url-base', target.base]);
  verdicts.push({
    client: 'mcp-add (no --agent)',
    ok: plain === target.url,
    tools: 0,
    detail: plain === target.url ? `prints the plain URL ${plain}` : `printed "${plain}", expected ${target.url}`,
  });
  const ctx: ProbeContext = {
    url: target.url,
    name: SERVER_NAME,
    bins,
    work: join(work, target.name),
    addCommand: (agent) => target.cli(['mcp-add', target.bindingId, '--agent', agent, '--name', SERVER_NAME, '--url-base', target.base]),
    call: target.call,
    timeoutMs: Number(opts['timeout-s']) * 1000,
  };
  // The search that clears each agent's home must be able to fail: it has to find the
  // tokens where the host keeps them.
  const secrets = target.secrets();
  const own = filesHolding(target.stateDir, secrets);
  verdicts.push({
    client: 'secret search (self-check)',
    ok: secrets.length > 0 && own.hits.length > 0,
    tools: 0,
    detail: `${secrets.length} secrets held by the host; found in ${own.hits.length} of its ${own.searched} files`,
  });
  for (const [client, probe] of PROBES) {
    if (only && !only.has(client)) continue;
    const started = Date.now();
    let verdict: Verdict;
    try {
      verdict = await probe(ctx);
    } catch (err) {
      verdict = { client, ok: false, tools: 0, detail: (err as Error).message };
    }
    verdicts.push(settle(target, verdict, started));
  }
  // Issue 20 item 5: the shims through Codex's own sandbox, configured as `shims path` says.
  const shim = target.shim;
  if (shim && (!only || only.has(CODEX_SANDBOX))) {
    const started = Date.now();
    let verdict: Verdict;
    try {
      verdict = await probeCodexSandbox({
        codex: bins.codex,
        shimsPath: () => target.cli(['shims', 'path', '--agent', 'codex', '--dir', shim.pathPrefix.split(':')[0]!, '--state-dir', shim.stateDir]),
        shim,
        work: ctx.work,
        timeoutMs: ctx.timeoutMs,
      });
    } catch (err) {
      verdict = { client: CODEX_SANDBOX, ok: false, tools: 0, detail: (err as Error).message };
    }
    verdicts.push(settle(target, verdict, started));
  }
  return verdicts;
}

async function main(): Promise<number> {
  const agentsDir = resolve(opts['agents-dir']!);
  mkdirSync(agentsDir, { recursive: true });
  const all = opts.only ? opts.only.split(',') : undefined;
  // `--only clis` or `--only clis:gh,clis:git` picks the CLI gate (all or some cases); any
  // other name is an agent probe of the dev and lab targets.
  const cliNames = all?.filter((n) => n === 'clis' || n.startsWith('clis:'));
  const agentNames = all?.filter((n) => !cliNames!.includes(n));
  const only = agentNames ? new Set(agentNames) : undefined;
  const wanted = new Set(opts.targets!.split(','));
  if (only && only.size === 0) {
    wanted.delete('dev');
    wanted.delete('lab');
  }
  if (cliNames && cliNames.length === 0) wanted.delete('clis');
  const bins = wanted.has('dev') || wanted.has('lab') ? await installAgents(agentsDir, log) : agentBins(agentsDir);
  const work = mkdtempSync(join(agentsDir, 'run-'));
  const results: { target: string; verdicts: Verdict[] }[] = [];
  let clis: CliVerdict[] | undefined;
  const runTarget = async (name: string, start: () => Promise<Target>): Promise<void> => {
    if (!wanted.has(name)) return;
    let target: Target;
    try {
      target = await start();
    } catch (err) {
      results.push({ target: name, verdicts: [{ client: 'start', ok: false, tools: 0, detail: (err as Error).message }] });
      return;
    }
    try {
      results.push({ target: name, verdicts: await gateTarget(target, bins, work, only) });
    } finally {
      await target.stop();
    }
  };
  try {
    await runTarget('dev', () => startDev(work));
    const labSkip = labTargetSkipReason();
    if (wanted.has('lab') && labSkip) {
      // CI requires every gate; a developer's machine without root or systemd skips it.
      const required = process.env.AGENT_CONNECTORS_REQUIRE_ALL_TESTS === '1';
      results.push({ target: 'lab', verdicts: [{ client: 'start', ok: !required, tools: 0, detail: `skipped: ${labSkip}` }] });
    } else {
      await runTarget('lab', async () => {
        const lab = await startLabTarget(work, REPO_ROOT, log);
        return { name: 'lab', ...lab, stateDir: lab.secretsDir, call: { tool: 'echo', args: { text: 'release gate' } } };
      });
    }
    if (wanted.has('clis')) {
      const picked = cliNames?.includes('clis') || !cliNames ? undefined : new Set(cliNames.map((n) => n.slice('clis:'.length)));
      const unknown = [...(picked ?? [])].filter((n) => !CLI_CASES.some((c) => c.name === n));
      if (unknown.length > 0) throw new Error(`--only names CLI cases that do not exist: ${unknown.join(', ')} (cases: ${CLI_CASES.map((c) => c.name).join(', ')})`);
      clis = await runCliGate({
        cases: CLI_CASES.filter((c) => !picked || picked.has(c.name)),
        cacheDir: agentsDir,
        log,
        stepTimeoutMs: Number(opts['timeout-s']) * 1000,
        keep: opts.keep,
      });
      results.push({ target: 'clis', verdicts: clis.map((v) => ({ client: v.name, ok: v.ok, tools: 0, detail: `${v.version} (${v.mode}, ${v.seconds.toFixed(1)} s): ${v.detail}`, command: v.command })) });
    }
  } finally {
    if (!opts.keep) rmSync(work, { recursive: true, force: true });
  }
  const lines = results.flatMap(({ target, verdicts }) =>
    verdicts.map((v) => `${target.padEnd(6)} ${v.client.padEnd(22)} ${v.ok ? 'ok  ' : 'FAIL'} ${v.tools ? `${v.tools} tools  ` : ''}${v.detail}${v.command ? `\n${' '.repeat(34)}ran: ${v.command}` : ''}`),
  );
  process.stdout.write(`${lines.join('\n')}\n`);
  mkdirSync(dirname(opts.report!), { recursive: true });
  writeFileSync(opts.report!, `${JSON.stringify({ at: new Date().toISOString(), results, ...(clis ? { clis } : {}) }, null, 2)}\n`);
  return results.every((r) => r.verdicts.every((v) => v.ok)) ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`gates: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
