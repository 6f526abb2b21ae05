import { homedir } from 'node:os';
import { join, resolve } from 'node:path';

/**
 * The state root (SPEC §2): --state-dir, else $STATE_DIRECTORY (systemd's StateDirectory=,
 * first entry if several), else /var/lib/agent-connectors for root, else the XDG state dir.
 */
export function resolveStateDir(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  if (flag) return resolve(flag);
  const fromSystemd = env.STATE_DIRECTORY?.split(':')[0];
  if (fromSystemd) return resolve(fromSystemd);
  if (process.getuid?.() === 0) return '/var/lib/agent-connectors';
  const xdg = env.XDG_STATE_HOME || join(env.HOME || homedir(), '.local', 'state');
  return join(xdg, 'agent-connectors');
}

export function forwarderDir(stateDir: string): string {
  return join(stateDir, 'mcp-forwarder');
}

export function defaultInstancesPath(stateDir: string): string {
  return join(forwarderDir(stateDir), 'instances.json');
}

export function defaultTokenPath(stateDir: string, instanceId: string): string {
  return join(forwarderDir(stateDir), `${instanceId}.token`);
}

/** The hand-off directory between renew fetch and renew apply (SPEC §4). */
export function defaultHandoffDir(stateDir: string): string {
  return join(stateDir, 'handoff');
}

export function defaultProvidersPath(stateDir: string): string {
  return join(stateDir, 'cli-proxy', 'providers.json');
}
