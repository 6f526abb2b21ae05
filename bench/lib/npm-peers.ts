/**
 * The peers a user would pick instead of the forwarder, installed from the npm registry,
 * pinned, into a cache directory outside the repository (as the release gates do):
 * mcp-remote (stdio ↔ Streamable HTTP, the token as `--header`) and supergateway in front
 * of it (stdio → Streamable HTTP, stateful). supergateway 4.0.0 is the newest; its
 * stateless default would start one mcp-remote per request, so the bench runs it with
 * `--stateful` (one child per session, what a user keeping a session gets).
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { npmInstall } from '../../release/agents.js';

export const NPM_PEERS = { 'mcp-remote': '0.15.1', supergateway: '4.0.0' } as const;

/** Where they are installed: $AGENT_CONNECTORS_BENCH_DIR, else a directory that outlives reboots' /tmp cleaning. */
export const NPM_PEERS_DIR = process.env.AGENT_CONNECTORS_BENCH_DIR ?? '/var/tmp/agent-connectors-bench';

export interface NpmPeerBins {
  mcpRemote: string;
  supergateway: string;
}

function bins(dir: string): NpmPeerBins {
  return {
    mcpRemote: join(dir, 'node_modules/mcp-remote/dist/proxy.js'),
    supergateway: join(dir, 'node_modules/supergateway/dist/index.js'),
  };
}

const stamp = (dir: string): string => join(dir, 'installed.json');
const wanted = JSON.stringify(NPM_PEERS);

/** The installed scripts, when the pinned versions are in the cache (no network). */
export function installedNpmPeers(dir = NPM_PEERS_DIR): NpmPeerBins | undefined {
  try {
    if (readFileSync(stamp(dir), 'utf8') !== wanted) return undefined;
  } catch {
    return undefined;
  }
  const b = bins(dir);
  return existsSync(b.mcpRemote) && existsSync(b.supergateway) ? b : undefined;
}

/** Installs the pinned versions once; a stamp makes a second run with the same pins a no-op. */
export async function installNpmPeers(log: (line: string) => void, dir = NPM_PEERS_DIR): Promise<NpmPeerBins> {
  const have = installedNpmPeers(dir);
  if (have) return have;
  await npmInstall(dir, NPM_PEERS, process.env.PATH ?? '/usr/bin:/bin', log);
  writeFileSync(stamp(dir), wanted);
  return bins(dir);
}
