import { PACKAGE_PARTS } from '../data/package-parts.js';
import { existsSync } from 'node:fs';
import { lstat, mkdir, readdir, readFile, rm, symlink, unlink } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { AGENT_USERS_FILE, agentUserEntry, renderAgentUsers } from '../data/agent-users.js';
import { SYSTEM_CA_BUNDLE_DIR, SYSTEM_SHIM_DIR } from '../data/state-layout.js';
import { LINK_UNIT, LINK_USER, OLD_LINK_UNIT } from '../data/unit-names.js';
import { ConfigError } from '../errors.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { copyPackage, planPackageCopy } from './copy-package.js';
import { LINK_STATE, moveOldLinkNames, OLD_STATE, OLD_STATE_LINK, type Act, type Systemctl } from './link-rename.js';

/** Where the running package lives (the directory holding package.json and dist/). */
export const PACKAGE_ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));

export interface InstallOptions {
  /** Install prefix for the package and the CLI link (default /usr/local). */
  prefix: string;
  /** Scratch root all files are written under (tests, image builds); paths inside units stay without it. */
  root: string;
  /** The node binary units run (default: the one running this command). */
  node: string;
  dryRun: boolean;
  /** After writing: systemd-sysusers, systemd-tmpfiles --create, systemctl daemon-reload (only with root "/"). */
  activate: boolean;
  /** Where things go (default: `layout(prefix)`, an administrator's install); the .deb uses `vendorLayout()`. */
  layout?: Layout;
  /** The package tree copied (default: the running one); the .deb build names its checkout. */
  from?: string;
  /**
   * A node_modules copied whole instead of the package tree's own (the .deb build's,
   * production dependencies only). Without it a checkout's own is copied less its dev-only
   * packages (copy-package.ts).
   */
  nodeModules?: string;
  /** `--agent-user`: names or UIDs added to the agent-users file (kept: an upgrade never drops one). */
  agentUsers?: readonly string[];
  /**
   * Whether /etc/agent-connectors/agent-users is written (default true). The .deb build says
   * false: /etc is the operator's, and a file in the package would be owned by dpkg; its
   * postinst creates the file instead when it is missing.
   */
  writeAgentUsers?: boolean;
}

export interface Layout {
  libDir: string;
  binLink: string;
  unitDir: string;
  sysusers: string;
  tmpfiles: string;
}

export function layout(prefix: string): Layout {
  return {
    libDir: join(prefix, 'lib', 'agent-connectors'),
    binLink: join(prefix, 'bin', 'agent-connectors'),
    // Units installed by an administrator (not a distribution package) belong in /etc.
    unitDir: '/etc/systemd/system',
    sysusers: '/etc/sysusers.d/agent-connectors.conf',
    tmpfiles: '/etc/tmpfiles.d/agent-connectors.conf',
  };
}

/**
 * Where a distribution package puts things: everything under /usr, nothing in /etc, which
 * stays the operator's (enablement, drop-ins, the host credential).
 */
export function vendorLayout(): Layout {
  return {
    libDir: '/usr/lib/agent-connectors',
    binLink: '/usr/bin/agent-connectors',
    unitDir: '/usr/lib/systemd/system',
    sysusers: '/usr/lib/sysusers.d/agent-connectors.conf',
    tmpfiles: '/usr/lib/tmpfiles.d/agent-connectors.conf',
  };
}

/**
 * What `--purge` (and the .deb's purge) deletes besides the installed files: the state
 * root, the shim directory, the shims' CA bundle and the link's private state (DynamicUser= keeps it under
 * /var/lib/private, with a link beside), under its name and 0.1.0's (a host purged
 * without the upgrade's move having run).
 */
export const PURGED_STATE = [
  '/var/lib/agent-connectors',
  SYSTEM_SHIM_DIR,
  SYSTEM_CA_BUNDLE_DIR,
  LINK_STATE,
  `/var/lib/${LINK_USER}`,
  OLD_STATE,
  OLD_STATE_LINK,
] as const;

export function renderUnit(text: string, libDir: string, node: string): string {
  return text.split('@LIBDIR@').join(libDir).split('@NODE@').join(node);
}

export { PACKAGE_PARTS };

export interface Action {
  what: string;
  path: string;
}

/**
 * Units an earlier version installed that this one no longer ships: removed by install
 * (an upgrade must not leave one enabled or triggering) and by uninstall.
 */
export const RETIRED_UNITS = ['agent-connectors-renew-apply.path', OLD_LINK_UNIT] as const;

export async function unitFiles(from: string = PACKAGE_ROOT): Promise<string[]> {
  return (await readdir(join(from, 'units'))).filter((n) => /\.(service|path|timer|target)$/.test(n)).sort();
}

/** Plans and (unless dry-run) performs the installation; returns what it did, in order. */
export async function install(options: InstallOptions): Promise<Action[]> {
  const l = options.layout ?? layout(options.prefix);
  const from = options.from ?? PACKAGE_ROOT;
  const at = (p: string): string => join(options.root, p);
  // Before anything changes: an invalid lockfile stops install here, dry run or not.
  const copy = await planPackageCopy(from, options.nodeModules);
  const { actions, act } = recorder(options.dryRun);
  const systemctl = options.activate && options.root === '/' && existsSync('/run/systemd/system') ? hostSystemctl : undefined;
  // Before the units are written: the old link unit is stopped while its file is still there.
  const { startLink } = await moveOldLinkNames({ root: options.root, act, systemctl });

  if (resolve(at(l.libDir)) !== PACKAGE_ROOT) {
    await act('replace package', l.libDir, async () => {
      await rm(at(l.libDir), { recursive: true, force: true });
      await mkdir(at(l.libDir), { recursive: true, mode: 0o755 });
      await copyPackage(copy, at(l.libDir));
    });
  }
  await act('link CLI', l.binLink, async () => {
    await mkdir(dirname(at(l.binLink)), { recursive: true });
    await unlink(at(l.binLink)).catch(() => undefined);
    await symlink(relative(dirname(l.binLink), join(l.libDir, 'dist', 'cli.js')), at(l.binLink));
  });
  for (const name of await unitFiles(from)) {
    const text = await readFile(join(from, 'units', name), 'utf8');
    await act('write unit', join(l.unitDir, name), async () => {
      await mkdir(at(l.unitDir), { recursive: true });
      await atomicWrite(at(join(l.unitDir, name)), renderUnit(text, l.libDir, options.node), { mode: 0o644 });
    });
  }
  for (const name of RETIRED_UNITS) {
    const path = join(l.unitDir, name);
    if (await lstat(at(path)).catch(() => undefined)) await act('remove retired unit', path, () => rm(at(path), { force: true }));
  }
  for (const [src, dest] of [
    ['units/sysusers.d/agent-connectors.conf', l.sysusers],
    ['units/tmpfiles.d/agent-connectors.conf', l.tmpfiles],
  ] as const) {
    const text = await readFile(join(from, src), 'utf8');
    await act('write config', dest, async () => {
      await mkdir(dirname(at(dest)), { recursive: true });
      await atomicWrite(at(dest), text, { mode: 0o644 });
    });
  }
  if (options.writeAgentUsers !== false) await writeAgentUsers(options, at, act);
  if (options.activate && options.root === '/') {
    await act('create users and groups', 'systemd-sysusers', async () => void (await execa('systemd-sysusers', [l.sysusers])));
    await act('create state directories', 'systemd-tmpfiles --create', async () => void (await execa('systemd-tmpfiles', ['--create', l.tmpfiles])));
    await act('reload systemd', 'systemctl daemon-reload', async () => void (await execa('systemctl', ['daemon-reload']).catch(() => undefined)));
  }
  // The old link ran: the new one runs after the upgrade (its enablement moved with it).
  if (startLink && systemctl) await act('start the link', LINK_UNIT, () => mustSystemctl(systemctl, ['start', LINK_UNIT]));
  return actions;
}

/**
 * The agent-users file the proxies' units name: created (with a header saying what it
 * is) when missing, so the operator finds it; `--agent-user` entries are appended unless
 * present. The operator's own lines and comments are never rewritten.
 */
async function writeAgentUsers(
  options: InstallOptions,
  at: (p: string) => string,
  act: Act,
): Promise<void> {
  const add = options.agentUsers ?? [];
  for (const u of add) {
    if (!agentUserEntry.safeParse(u).success) throw new ConfigError(`--agent-user: "${u}" is not a user name or numeric UID`);
  }
  const existing = await readFile(at(AGENT_USERS_FILE), 'utf8').catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  const text = renderAgentUsers(existing, add);
  if (text === existing) return;
  await act(existing === undefined ? 'write agent users' : 'add agent users', AGENT_USERS_FILE, async () => {
    await mkdir(dirname(at(AGENT_USERS_FILE)), { recursive: true, mode: 0o755 });
    await atomicWrite(at(AGENT_USERS_FILE), text, { mode: 0o644 });
  });
}

export interface UninstallOptions {
  prefix: string;
  root: string;
  dryRun: boolean;
  /** Also delete /var/lib/agent-connectors (tokens, registry, catalog) and fetch's state. */
  purge: boolean;
}

/** Reverses install. State stays unless `purge`: an upgrade is uninstall + install. */
export async function uninstall(options: UninstallOptions): Promise<Action[]> {
  const l = layout(options.prefix);
  const at = (p: string): string => join(options.root, p);
  const actions: Action[] = [];
  const remove = async (what: string, path: string): Promise<void> => {
    if (!(await lstat(at(path)).catch(() => undefined))) return;
    actions.push({ what, path });
    if (!options.dryRun) await rm(at(path), { recursive: true, force: true });
  };
  for (const name of [...(await unitFiles()), ...RETIRED_UNITS]) await remove('remove unit', join(l.unitDir, name));
  await remove('remove config', l.sysusers);
  await remove('remove config', l.tmpfiles);
  await remove('remove CLI link', l.binLink);
  if (resolve(at(l.libDir)) !== PACKAGE_ROOT) await remove('remove package', l.libDir);
  if (options.purge) {
    await remove('purge config', AGENT_USERS_FILE);
    for (const path of PURGED_STATE) await remove('purge state', path);
  }
  return actions;
}

function recorder(dryRun: boolean): { actions: Action[]; act: Act } {
  const actions: Action[] = [];
  const act: Act = async (what, path, fn) => {
    actions.push({ what, path });
    if (!dryRun) await fn();
  };
  return { actions, act };
}

const hostSystemctl: Systemctl = async (args) => (await execa('systemctl', args, { reject: false })).exitCode ?? 1;

async function mustSystemctl(systemctl: Systemctl, args: string[]): Promise<void> {
  const code = await systemctl(args);
  if (code !== 0) throw new Error(`systemctl ${args.join(' ')} failed (exit ${code}); see: systemctl status ${args.at(-1) ?? ''}`);
}

/**
 * The .deb's postinst (`agent-connectors upgrade-names`): 0.1.0's renew-fetch unit, state
 * and env file moved to the link's names on the host, and the link started if the old unit
 * ran. dpkg has already replaced the unit files and postinst reloaded systemd; the old
 * unit, still running, stays known to systemd until it stops.
 */
export async function upgradeNames(): Promise<Action[]> {
  const { actions, act } = recorder(false);
  const systemctl = existsSync('/run/systemd/system') ? hostSystemctl : undefined;
  const { startLink } = await moveOldLinkNames({ root: '/', act, systemctl });
  if (systemctl && actions.length > 0) await act('reload systemd', 'systemctl daemon-reload', () => mustSystemctl(systemctl, ['daemon-reload']));
  if (startLink && systemctl) await act('start the link', LINK_UNIT, () => mustSystemctl(systemctl, ['start', LINK_UNIT]));
  return actions;
}
