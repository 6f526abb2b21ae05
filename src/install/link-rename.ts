import { lstat, readdir, readFile, readlink, rename, rm, symlink, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { LINK_UNIT, LINK_USER, OLD_LINK_UNIT, unitStem } from '../data/unit-names.js';
import { atomicWrite } from '../fs/atomic-write.js';

/**
 * 0.1.0 ran the link as agent-connectors-renew-fetch.service; this release names it
 * agent-connectors-link.service, and with the unit its DynamicUser's state directory and
 * its env file (docs/packaging.md, "Upgrading from 0.1.0"). The .deb's postinst (through
 * `agent-connectors upgrade-names`) and `agent-connectors install` both move them with
 * this module, so a host keeps its enablement, its renewals in flight and its settings
 * whichever way it was installed. Every step is skipped once done: a rerun, or a host
 * that never had 0.1.0, changes nothing.
 */

const SYSTEMD_ETC = '/etc/systemd/system';
const OLD_USER = unitStem(OLD_LINK_UNIT);
/** DynamicUser= keeps StateDirectory= under /var/lib/private, with a symlink in /var/lib. */
export const OLD_STATE = join('/var/lib/private', OLD_USER);
export const LINK_STATE = join('/var/lib/private', LINK_USER);
export const OLD_STATE_LINK = join('/var/lib', OLD_USER);
const ENV_DIR = '/etc/agent-connectors';
export const OLD_ENV = join(ENV_DIR, 'renew-fetch.env');
export const LINK_ENV = join(ENV_DIR, 'link.env');

/** Records a step and, unless it is a dry run, does it (install's `act`). */
export type Act = (what: string, path: string, fn: () => Promise<void>) => Promise<void>;
/** `systemctl ARGS`' exit code; absent where systemd does not run (a chroot, a scratch root). */
export type Systemctl = (args: string[]) => Promise<number>;

export interface LinkRenameOptions {
  /** Paths are under this root ('/' on a host, a scratch directory in tests). */
  root: string;
  act: Act;
  systemctl?: Systemctl | undefined;
}

/**
 * Everything but starting the new unit, which the caller does once the new unit files are
 * in place and systemd has reloaded (`startLink`). The old unit is stopped first: its
 * process holds the state directory that moves.
 */
export async function moveOldLinkNames(o: LinkRenameOptions): Promise<{ startLink: boolean }> {
  const at = (p: string): string => join(o.root, p);
  let startLink = false;
  if (o.systemctl && (await o.systemctl(['is-active', '--quiet', OLD_LINK_UNIT])) === 0) {
    startLink = true;
    const systemctl = o.systemctl;
    await o.act('stop the old link unit', OLD_LINK_UNIT, async () => {
      const code = await systemctl(['stop', OLD_LINK_UNIT]);
      // Its state directory must not move under a running process: stop here, move nothing.
      if (code !== 0) throw new Error(`systemctl stop ${OLD_LINK_UNIT} failed (exit ${code}); nothing was moved`);
    });
  }
  for (const link of await oldUnitLinks(at(SYSTEMD_ETC))) {
    const path = join(SYSTEMD_ETC, link.slice(at(SYSTEMD_ETC).length + 1));
    await o.act('move enablement link', path, () => moveUnitLink(link));
  }
  await moveIfFree(o, 'move drop-ins', join(SYSTEMD_ETC, `${OLD_LINK_UNIT}.d`), join(SYSTEMD_ETC, `${LINK_UNIT}.d`));
  await moveIfFree(o, 'move state', OLD_STATE, LINK_STATE);
  const stateLink = await lstat(at(OLD_STATE_LINK)).catch(() => undefined);
  // systemd makes the /var/lib link again for the new name when the unit starts.
  if (stateLink?.isSymbolicLink() && !(await exists(at(OLD_STATE)))) await o.act('remove state link', OLD_STATE_LINK, () => unlink(at(OLD_STATE_LINK)));
  await mergeOldEnv(o);
  return { startLink };
}

/**
 * The symlinks systemd made for the old unit under /etc/systemd/system: enablement
 * (`*.wants/`, `*.requires/`), a mask (→ /dev/null) or a linked unit file. install's own
 * rendered unit file there is a regular file, removed with the retired units.
 */
async function oldUnitLinks(dir: string): Promise<string[]> {
  const out: string[] = [];
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) {
    if (e.isSymbolicLink() && e.name === OLD_LINK_UNIT) out.push(join(dir, e.name));
    if (e.isDirectory() && /\.(wants|requires|upholds)$/.test(e.name)) {
      const inner = join(dir, e.name, OLD_LINK_UNIT);
      if ((await lstat(inner).catch(() => undefined))?.isSymbolicLink()) out.push(inner);
    }
  }
  return out;
}

/**
 * The same link for the new name beside the old one: `X.wants/old → …/old` becomes
 * `X.wants/new → …/new`, a mask (→ /dev/null) stays a mask. Mirroring the links instead of
 * `systemctl enable` works in a chroot too, and keeps exactly what the operator enabled.
 */
async function moveUnitLink(link: string): Promise<void> {
  const target = await readlink(link);
  const next = join(dirname(link), LINK_UNIT);
  if (!(await exists(next))) await symlink(basename(target) === OLD_LINK_UNIT ? join(dirname(target), LINK_UNIT) : target, next);
  await unlink(link);
}

async function moveIfFree(o: LinkRenameOptions, what: string, from: string, to: string): Promise<void> {
  const at = (p: string): string => join(o.root, p);
  if (!(await exists(at(from))) || (await exists(at(to)))) return;
  await o.act(what, to, () => rename(at(from), at(to)));
}

/**
 * renew-fetch.env into link.env. systemd read renew-fetch.env first and link.env after it,
 * so a key both set took link.env's value: the merge keeps exactly that. Without a
 * link.env the file is renamed (mode and owner kept). Otherwise the merged link.env gets
 * the stricter of the two modes, so a secret an operator put in a 0600 renew-fetch.env
 * is no more readable than before; renew-fetch.env is removed only after.
 */
async function mergeOldEnv(o: LinkRenameOptions): Promise<void> {
  const at = (p: string): string => join(o.root, p);
  const old = await lstat(at(OLD_ENV)).catch(() => undefined);
  if (!old?.isFile()) return;
  const current = await lstat(at(LINK_ENV)).catch(() => undefined);
  if (!current) {
    await o.act('rename env file', LINK_ENV, () => rename(at(OLD_ENV), at(LINK_ENV)));
    return;
  }
  await o.act('merge env file', LINK_ENV, async () => {
    const merged = mergeEnvText(await readFile(at(LINK_ENV), 'utf8'), await readFile(at(OLD_ENV), 'utf8'));
    await atomicWrite(at(LINK_ENV), merged, { mode: current.mode & old.mode & 0o777, owner: { uid: current.uid, gid: current.gid } });
    await rm(at(OLD_ENV));
  });
}

const ASSIGNMENT = /^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=/;

/**
 * link.env's text with renew-fetch.env's lines after it. Every line is kept: one whose key
 * link.env already sets becomes a comment (it never took effect), the rest keep their
 * effect and order.
 */
export function mergeEnvText(linkEnv: string, oldEnv: string): string {
  const keys = new Set(linkEnv.split('\n').flatMap((line) => ASSIGNMENT.exec(line)?.[1] ?? []));
  const lines = oldEnv.replace(/\n$/, '').split('\n').map((line) => {
    const key = ASSIGNMENT.exec(line)?.[1];
    return key !== undefined && keys.has(key) ? `# (link.env sets ${key} above) ${line}` : line;
  });
  const head = linkEnv === '' || linkEnv.endsWith('\n') ? linkEnv : `${linkEnv}\n`;
  return `${head}# From renew-fetch.env (agent-connectors 0.1.0), merged on upgrade; docs/packaging.md.\n${lines.join('\n')}\n`;
}

async function exists(path: string): Promise<boolean> {
  return (await lstat(path).catch(() => undefined)) !== undefined;
}
