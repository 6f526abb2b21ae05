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

/**
 * The shim directory of a system install: outside the installed package (an upgrade
 * replaces that) and outside the state root (which the Agent UID cannot enter); created
 * by tmpfiles.d, kept by uninstall without purge.
 */
export const SYSTEM_SHIM_DIR = '/var/lib/agent-connectors-shims';

/** Every path under the state root, named once (SPEC §2). Commands' flags may override single entries. */
export interface StateLayout {
  root: string;
  /** The forwarder's directory (0700 agent-connectors): the registry and the bindings' token files. */
  forwarderDir: string;
  instances: string;
  /** The default token file of an AgentInstance. */
  instanceToken: (instanceId: string) => string;
  /** The cli-proxy's directory (0700 agent-connectors): the catalog and the providers' token files. */
  cliProxyDir: string;
  providers: string;
  /** The default token file of a provider. */
  providerToken: (provider: string) => string;
  /** The hand-off directory between renew fetch and renew apply (SPEC §4). */
  handoff: string;
  /** The native_cli audit spool (SPEC §9): the cli-proxy writes, the link uploads and deletes. */
  audit: string;
  /** The link's own state (renewal's requestIds in flight); nobody else reads it. */
  linkPrivate: string;
  /** Where a non-root user's shims go by default. */
  shims: string;
  /** The host's CLI CA (SPEC §10): 0700, the cli-proxy's user alone. */
  cliCa: string;
}

export function stateLayout(stateDir: string): StateLayout {
  const root = resolve(stateDir);
  const forwarderDir = join(root, 'mcp-forwarder');
  const cliProxyDir = join(root, 'cli-proxy');
  return {
    root,
    forwarderDir,
    instances: join(forwarderDir, 'instances.json'),
    instanceToken: (instanceId) => join(forwarderDir, `${instanceId}.token`),
    cliProxyDir,
    providers: join(cliProxyDir, 'providers.json'),
    providerToken: (provider) => join(cliProxyDir, `${provider}.token`),
    handoff: join(root, 'handoff'),
    audit: join(root, 'audit'),
    linkPrivate: join(root, 'link'),
    shims: join(root, 'shims'),
    cliCa: join(root, 'cli-ca'),
  };
}

/** The system state root, as the units pass it (SPEC §2). */
export const SYSTEM_STATE_DIR = '/var/lib/agent-connectors';

/**
 * Where the shims' CA bundle lives on a system install: a directory of its own that every
 * user may read, so the cli-proxy that writes it needs no write access to the shims (apply
 * owns that directory and sweeps whatever it did not render).
 */
export const SYSTEM_CA_BUNDLE_DIR = '/var/lib/agent-connectors-ca';
export const CA_BUNDLE_FILE = 'ca-bundle.pem';

/**
 * The shims' CA bundle (SPEC §10), written by the cli-proxy, named by every TLS-mode shim:
 * the system's for the system state root (whoever runs: the cli-proxy's unit runs as
 * agent-connectors, `shims install` as root), else `<state>/ca-bundle/`.
 */
export function defaultCaBundle(stateDir: string): string {
  const root = resolve(stateDir);
  return join(root === SYSTEM_STATE_DIR ? SYSTEM_CA_BUNDLE_DIR : join(root, 'ca-bundle'), CA_BUNDLE_FILE);
}

/** In the CLI CA's directory: its key and certificate together (0600), and the certificate alone. */
export const CA_FILE = 'ca.pem';
export const CA_CERT_FILE = 'ca-cert.pem';
/** A CLI CA this close to its end is replaced when the cli-proxy starts, so no leaf is cut short by it. */
export const CA_RENEW_BEFORE_MS = 30 * 86_400_000;
