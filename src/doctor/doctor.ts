import { readFile, readdir, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { parseCatalog } from '../data/catalog.js';
import type { ParseResult } from '../data/parse.js';
import { parseInstancesFile } from '../data/registry.js';
import { defaultCaBundle, stateLayout } from '../data/state-layout.js';
import { APPLY_UNIT, LINK_UNIT, SERVICE_UNITS, unitStem } from '../data/unit-names.js';
import { HANDOFF_ROOT_MODE, handoffPaths, readSlots, SLOT_MANIFEST_FILE } from '../data/handoff.js';
import { agentUsersHealth } from '../data/agent-users.js';
import { readHostRevoked } from '../data/host-revoked.js';
import { agentUsersProblem, HOST_REVOKED, partProblem, SLOT_FILE_INVALID } from '../data/problem-codes.js';
import { auditChecks } from './audit-checks.js';
import { cliCaChecks } from './cli-ca-checks.js';
import { Findings, type Finding } from './finding.js';
import { linkChecks, readEnrolment, reapplyFix, type LinkFacts } from './link-checks.js';
import { probeHealth, systemdRunning, unitState } from './probe.js';

export type { Finding, Level } from './finding.js';

export interface DoctorOptions {
  stateDir: string;
  handoffDir: string;
  /** The shims' CA bundle (TLS mode), if not the default for the state root. */
  caBundle?: string;
  /** The user AI agents run as: must not be able to read any secret. */
  agentUser?: string;
  /** The proxies' agent-users file: missing or empty (every agent gets 403) is a problem. Undefined: not checked. */
  agentUsersFile?: string;
  forwarderUrl: string;
  cliProxyUrl: string;
  systemd: boolean;
  passwdPath?: string;
  /** The host credential file the link loads (default /etc/agent-connectors/host-credential); its presence marks the host enrolled. */
  credentialPath?: string;
  groupPath?: string;
  now?: number;
}

interface Account {
  name: string;
  uid: number;
  gid: number;
  groups: Set<number>;
}

async function readAccounts(passwdPath: string, groupPath: string): Promise<{ users: Map<string, Account>; groups: Map<string, number> }> {
  const users = new Map<string, Account>();
  const groups = new Map<string, number>();
  const members = new Map<string, number[]>();
  for (const line of (await readFile(groupPath, 'utf8').catch(() => '')).split('\n')) {
    const [name, , gid, list] = line.split(':');
    if (!name || !gid) continue;
    groups.set(name, Number(gid));
    for (const m of (list ?? '').split(',').filter(Boolean)) members.set(m, [...(members.get(m) ?? []), Number(gid)]);
  }
  for (const line of (await readFile(passwdPath, 'utf8').catch(() => '')).split('\n')) {
    const [name, , uid, gid] = line.split(':');
    if (!name || !uid || !gid) continue;
    users.set(name, { name, uid: Number(uid), gid: Number(gid), groups: new Set([Number(gid), ...(members.get(name) ?? [])]) });
  }
  return { users, groups };
}

/** Could `who` open `path` for reading, by the mode bits of the file and every directory above it? */
export async function canRead(path: string, who: Account): Promise<boolean> {
  if (who.uid === 0) return true;
  const allows = (st: { uid: number; gid: number; mode: number }, bit: number): boolean => {
    if (st.uid === who.uid) return ((st.mode >> 6) & bit) !== 0;
    if (who.groups.has(st.gid)) return ((st.mode >> 3) & bit) !== 0;
    return (st.mode & bit) !== 0;
  };
  let dir = dirname(path);
  for (;;) {
    const st = await stat(dir).catch(() => undefined);
    if (!st || !allows(st, 1)) return false;
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  const st = await stat(path).catch(() => undefined);
  return st !== undefined && allows(st, st.isDirectory() ? 5 : 4);
}

/**
 * Checks a host installation and says, for each problem, the command that fixes it:
 * users and groups, directory and file owners and modes, that the Agent UID can read no
 * secret, the two ports, the units, token freshness, registry and catalog validity, TLS
 * mode's CLI CA and CA bundle (cli-ca-checks.ts), the audit spool (audit-checks.ts); on
 * an enrolled host also the link, the desired-state versions and drift (link-checks.ts).
 */
export async function runDoctor(o: DoctorOptions): Promise<Finding[]> {
  return (await diagnose(o)).findings;
}

export async function diagnose(o: DoctorOptions): Promise<{ findings: Finding[]; link: LinkFacts }> {
  const out = new Findings();
  const now = o.now ?? Date.now();
  const layout = stateLayout(o.stateDir);
  const handoff = handoffPaths(o.handoffDir);
  const { users, groups } = await readAccounts(o.passwdPath ?? '/etc/passwd', o.groupPath ?? '/etc/group');
  const service = users.get('agent-connectors');
  const renewGid = groups.get('agent-connectors-renew');
  const sysusersFix = 'systemd-sysusers /etc/sysusers.d/agent-connectors.conf';
  const tmpfilesFix = 'systemd-tmpfiles --create agent-connectors.conf';

  // 1. users and groups
  if (service) out.ok('users', `user agent-connectors (uid ${service.uid})`);
  else out.problem('user_missing', 'users', 'user agent-connectors is missing', sysusersFix);
  if (renewGid === undefined) out.problem('group_missing', 'users', 'group agent-connectors-renew is missing', sysusersFix);
  else if (service && !service.groups.has(renewGid)) out.problem('group_membership', 'users', 'agent-connectors is not in group agent-connectors-renew', 'usermod -aG agent-connectors-renew agent-connectors');

  // 2. directories and their modes
  const dirs: Array<[string, number, string, string]> = [
    [o.stateDir, 0o750, 'agent-connectors', 'agent-connectors-renew'],
    [layout.forwarderDir, 0o700, 'agent-connectors', 'agent-connectors'],
    [layout.cliProxyDir, 0o700, 'agent-connectors', 'agent-connectors'],
    // Sticky: the link's group may add entries to the root but not rename apply's (handoff-dirs.ts).
    [o.handoffDir, HANDOFF_ROOT_MODE, 'agent-connectors', 'agent-connectors-renew'],
    [handoff.inbox, 0o2770, 'agent-connectors', 'agent-connectors-renew'],
    [handoff.slots, 0o2770, 'agent-connectors', 'agent-connectors-renew'],
  ];
  for (const [path, mode, user, group] of dirs) {
    const st = await stat(path).catch(() => undefined);
    if (!st) {
      out.problem('directory_missing', 'directories', `${path} is missing`, tmpfilesFix);
      continue;
    }
    const actual = st.mode & 0o7777;
    const owner = users.get(user)?.uid;
    const gid = groups.get(group);
    if (actual !== mode) out.problem('directory_mode', 'directories', `${path} has mode ${actual.toString(8)}, expected ${mode.toString(8)}`, `chmod ${mode.toString(8)} ${path}`);
    else if ((owner !== undefined && st.uid !== owner) || (gid !== undefined && st.gid !== gid)) out.problem('directory_owner', 'directories', `${path} is not owned by ${user}:${group}`, `chown ${user}:${group} ${path}`);
    else out.ok('directories', `${path} ${mode.toString(8)} ${user}:${group}`);
  }

  // 3. registry and catalog, and every token file they name
  const secrets: string[] = [];
  const configFiles: Array<[string, (t: string) => ParseResult<Record<string, { tokenFile: string }>>, string]> = [
    [layout.instances, parseInstancesFile, 'registry'],
    [layout.providers, parseCatalog, 'catalog'],
  ];
  const tokenFiles = new Set<string>();
  const neededSlots = new Set<string>();
  for (const [path, parse, what] of configFiles) {
    const text = await readFile(path, 'utf8').catch(() => undefined);
    if (text === undefined) {
      out.warn(`${what}_absent`, what, `${path} does not exist (nothing configured yet)`);
      continue;
    }
    secrets.push(path);
    const parsed = parse(text);
    if (!parsed.ok) {
      out.problem(`${what}_invalid`, what, `${path} is invalid: ${parsed.error}; the last good one is serving`, `edit ${path} (then it reloads by itself)`);
      continue;
    }
    out.ok(what, `${path} is valid`);
    for (const [key, entry] of Object.entries(parsed.value)) {
      tokenFiles.add(entry.tokenFile);
      const instanceId = (entry as { instanceId?: string }).instanceId;
      neededSlots.add(what === 'registry' && instanceId ? `instance:${instanceId}` : `cli:${key}`);
    }
  }
  for (const file of [...tokenFiles, ...(await readdir(handoff.inbox).catch(() => [] as string[])).map((n) => join(handoff.inbox, n))]) {
    secrets.push(file);
    const st = await stat(file).catch(() => undefined);
    if (!st) {
      if (tokenFiles.has(file)) out.problem('token_missing', 'tokens', `${file} does not exist yet`, `journalctl -u ${unitStem(LINK_UNIT)} -u ${unitStem(APPLY_UNIT)}`);
      continue;
    }
    if (tokenFiles.has(file) && (st.mode & 0o777) !== 0o600) out.problem('token_mode', 'tokens', `${file} has mode ${(st.mode & 0o777).toString(8)}, expected 600`, `chmod 600 ${file}`);
    else if (tokenFiles.has(file) && service && st.uid !== service.uid) out.problem('token_owner', 'tokens', `${file} is not owned by agent-connectors`, `chown agent-connectors: ${file}`);
  }

  // fetch's host credential (LoadCredential= source) is a secret too
  const credential = o.credentialPath ?? '/etc/agent-connectors/host-credential';
  const credSt = await stat(credential).catch(() => undefined);
  if (credSt) {
    secrets.push(credential);
    if ((credSt.mode & 0o077) !== 0) out.problem('credential_mode', 'credential', `${credential} has mode ${(credSt.mode & 0o777).toString(8)}; only root may read it`, `chmod 600 ${credential}`);
    else out.ok('credential', `${credential} is readable by its owner only`);
  } else if (o.systemd) {
    out.warn('credential_missing', 'credential', `${credential} does not exist: renew fetch cannot start`, `agent-connectors enroll --gateway URL${credential === '/etc/agent-connectors/host-credential' ? '' : ` --credential ${credential}`}`);
  }

  // 3b. TLS mode's trust: the CLI CA (its key is a secret) and the shims' CA bundle
  secrets.push(...(await cliCaChecks({ dir: layout.cliCa, bundle: o.caBundle ?? defaultCaBundle(o.stateDir), uid: service?.uid, now }, out)));

  // 4. the Agent UID reads nothing secret
  if (o.agentUser) {
    const agent = users.get(o.agentUser);
    if (!agent) out.problem('agent_user_unknown', 'agent user', `no such user ${o.agentUser}`);
    else {
      const readable: string[] = [];
      for (const path of [...secrets, handoff.inbox]) if (await canRead(path, agent)) readable.push(path);
      if (readable.length === 0) out.ok('agent user', `${o.agentUser} can read no secret (${secrets.length} files checked)`);
      for (const path of readable) out.problem('agent_reads_secret', 'agent user', `${o.agentUser} can read ${path}`, `chmod o-rwx ${path}; ${tmpfilesFix}`);
    }
  }

  // 4b. who may use the proxies at all: the likeliest first-install mistake leaves nobody.
  if (o.agentUsersFile !== undefined) await agentUsersCheck(o.agentUsersFile, o.agentUser, out);
  // 4c. access ended for the whole host: apply deleted everything and keeps it so.
  const revoked = await readHostRevoked(o.handoffDir);
  if (revoked) {
    const why = revoked.by === 'gateway' ? 'the Gateway refused its credential (401): the host was removed in the platform' : revoked.by === 'unenroll' ? 'agent-connectors unenroll' : 'a revocation marker apply could not read';
    out.problem(HOST_REVOKED, 'revocation', `access ended for the whole host at ${revoked.at} (${why}): every token file and shim was deleted; it serves nothing until it is enrolled again`, 'agent-connectors enroll --gateway URL --force (with a new pairing code from the platform)');
  }

  const managed = (await readEnrolment(credential)).enrolled;
  // 5. token freshness from slot files; every binding and provider needs one, or fetch never renews it
  const { slots, errors } = await readSlots(handoff);
  const known = new Set(slots.map((s) => s.slot));
  for (const slot of neededSlots) {
    // On an enrolled host bind and unbind refuse; apply re-applying the state recreates slots.
    const slotFix = managed ? reapplyFix(o.handoffDir) : slot.startsWith('cli:') ? 'agent-connectors shims install' : 'agent-connectors bind <bindingId> --instance-id … --upstream … (again)';
    if (!known.has(slot)) out.problem('slot_missing', 'renewal', `${slot} has no slot file and is not in the slot manifest: its token will never be renewed`, slotFix);
  }
  for (const e of errors) {
    // The manifest is apply's: removed, apply writes it again from the state in force at its next start.
    const fix = e.file === SLOT_MANIFEST_FILE ? `rm '${join(handoff.slots, e.file)}' and restart ${unitStem(APPLY_UNIT)}` : `rm '${join(handoff.slots, e.file)}' and bind again`;
    out.problem(SLOT_FILE_INVALID, 'renewal', `slot file ${e.file} is invalid: ${e.error}`, fix);
  }
  for (const s of slots) {
    if (s.revoked) out.problem('slot_revoked', 'renewal', `${s.slot} was revoked by the Gateway`, managed ? 'disconnect it in the platform: the next desired state removes it' : 'agent-connectors unbind <its bindings>');
    else if (!s.tokenId || !s.expiresAt) out.problem('token_never_received', 'renewal', `${s.slot} has never received a token`, `journalctl -u ${unitStem(LINK_UNIT)}`);
    else if (Date.parse(s.expiresAt) <= now) out.problem('token_expired', 'renewal', `${s.slot} token expired at ${s.expiresAt}`, `journalctl -u ${unitStem(LINK_UNIT)} -u ${unitStem(APPLY_UNIT)}`);
    else out.ok('renewal', `${s.slot} token valid until ${s.expiresAt}`);
  }

  // 6. the two loopback services
  for (const [name, url] of [['forwarder', o.forwarderUrl], ['cli-proxy', o.cliProxyUrl]] as const) {
    const { health, said } = await probeHealth(url);
    const code = partProblem(name, health);
    if (code === undefined) out.ok('ports', `${name} answers on ${url}`);
    else if (health === 'degraded') out.problem(code, 'ports', `${name} on ${url} is ${said}`, `journalctl -u agent-connectors-${name}`);
    else out.problem(code, 'ports', `${name} does not answer on ${url}`, `systemctl start agent-connectors-${name}`);
  }

  // 7. units
  if (o.systemd && !(await systemdRunning())) {
    out.warn('systemd_absent', 'units', 'systemd is not running on this host; skipped the unit checks (use --no-systemd to silence this)');
  } else if (o.systemd) {
    for (const unit of SERVICE_UNITS) {
      const { state, exitCode } = await unitState(unit);
      if (state === 'active') out.ok('units', `${unit} active`);
      else out.problem('unit_inactive', 'units', `${unit} is ${state}`, state === 'unknown' || exitCode === 4 ? 'agent-connectors install' : `systemctl enable --now ${unit}`);
    }
  }
  // 8. an enrolled host: enrolment, the link, versions, drift (none of it on a host never enrolled)
  const link = await linkChecks({ credentialPath: credential, handoffDir: o.handoffDir, layout, now }, out);
  // 9. the native_cli audit spool: its directory, its depth, and whether it drains
  await auditChecks({ dir: layout.audit, now, uid: service?.uid, gid: renewGid, enrolled: link.enrolment.enrolled, link: link.link }, out);
  return { findings: out.list, link };
}

async function agentUsersCheck(file: string, agentUser: string | undefined, out: Findings): Promise<void> {
  const health = await agentUsersHealth(file);
  const code = agentUsersProblem(health);
  if (code === undefined) return out.ok('agent users', `${file} names who may use the proxies`);
  if (health === 'invalid') return out.problem(code, 'agent users', `${file} is not one user name or UID per line: the proxies keep their last good list (none at their start)`, `edit ${file} (the proxies re-read it by themselves)`);
  out.problem(
    code,
    'agent users',
    `${file} ${health === 'missing' ? 'does not exist' : 'names no user'}: every agent gets 403 from both proxies`,
    `echo ${agentUser ?? '<the user your agents run as>'} >> ${file} (the proxies re-read it by themselves)`,
  );
}
