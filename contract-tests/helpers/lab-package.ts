import { mkdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLI, REPO_ROOT } from '../../test/support/cli-proc.js';
import { ensureSystemUser, lookupUser, run, type Lab, type RunResult, type SystemUser } from '../../test/support/lab.js';
import type { TapTest } from '../../test/support/tap.js';
import { tempDir } from '../../test/support/temp-dir.js';

/**
 * What the lab test files share: the package installed into a scratch root the way an
 * operator's `install` would, the service user created on the host, the lab's drop-ins,
 * and a teardown that keeps the logs of a failed run.
 */

export const SVC = 'agent-connectors';
export const FORWARDER = 'agent-connectors-forwarder.service';
export const CLI_PROXY = 'agent-connectors-cli-proxy.service';
/** The link (`agent-connectors link`), a DynamicUser named after the unit. */
export const LINK = 'agent-connectors-link.service';
export const APPLY = 'agent-connectors-renew-apply.service';
export const TARGET = 'agent-connectors.target';
export const AGENT_USER = 'ac-agent-lab';
export const PREFIX = '/opt';
export const LIB_DIR = `${PREFIX}/lib/agent-connectors`;
export const STATE = '/var/lib/agent-connectors';
/** systemd's DynamicUser= range. */
export const DYNAMIC_UIDS = [61184, 65519] as const;

export interface LabPackage {
  scratch: string;
  root: string;
  /** The lab's scratch space; the lab keeps it at its path, visible inside. */
  work: string;
  unitDir: string;
  appDir: string;
  /** The package's tmpfiles.d without its /etc lines (the lab's /etc is read-only). */
  tmpfilesConf: string;
  svc: SystemUser;
  agent: SystemUser;
  dropIn: (unit: string, name: string, text: string) => void;
  /** The lab, once booted: the teardown ends it and shows its logs if the test failed. */
  lab?: Lab;
  /** Set when the test stopped the lab itself (its journal was saved first). */
  journalAtEnd?: string;
}

/**
 * Installs the package for a lab, or fails `t` and returns undefined. The forwarder and
 * the cli-proxy get `--allowed-uids <agent>,root`: the agent and the test's own requests.
 */
export async function installForLab(t: TapTest, prefix: string): Promise<LabPackage | undefined> {
  // The units run this node; ProtectHome=/PrivateTmp= would hide one under a home or /tmp.
  if (/^\/(home|root|run\/user|tmp|var\/tmp)\//.test(process.execPath)) {
    t.fail(`node is at ${process.execPath}, which the units' ProtectHome=/PrivateTmp= hide from them: run the tests with a node installed elsewhere (e.g. /usr/bin/node)`);
    return undefined;
  }
  const scratch = tempDir(prefix);
  const root = join(scratch, 'root');
  const work = join(scratch, 'work');
  mkdirSync(work, { recursive: true });
  const unitDir = join(root, 'etc/systemd/system');
  const partial = { scratch, root } as LabPackage;
  keepLogsOnFailure(t, partial);
  const installed = await installedOnce();
  if (installed.code !== 0) {
    t.fail(`install into the scratch root failed (${installed.code}):\n${installed.stdout}${installed.stderr}`);
    return undefined;
  }
  // Hard links: every file of the tree as install wrote it, in a moment. A lab adds files
  // (drop-ins, a client script) and changes none, so the labs cannot see each other's.
  const copied = await run('cp', ['-al', installed.root, root], { timeoutMs: 120_000 });
  if (copied.code !== 0) {
    t.fail(`copying the installed tree failed (${copied.code}): ${copied.stderr}`);
    return undefined;
  }
  const sysusers = await run('systemd-sysusers', [join(root, 'etc/sysusers.d/agent-connectors.conf')]);
  t.equal(sysusers.code, 0, `systemd-sysusers creates the service user and group on the host${sysusers.code === 0 ? '' : `: ${sysusers.stderr}`}`);
  const svc = await lookupUser(SVC);
  if (!svc) {
    t.fail(`the service user ${SVC} is missing after systemd-sysusers`);
    return undefined;
  }
  const dropIn = (unit: string, name: string, text: string): void => {
    mkdirSync(join(unitDir, `${unit}.d`), { recursive: true });
    writeFileSync(join(unitDir, `${unit}.d`, name), text);
  };
  for (const unit of [FORWARDER, CLI_PROXY]) {
    const execStart = /^ExecStart=(.+)$/m.exec(readFileSync(join(unitDir, unit), 'utf8'))?.[1];
    dropIn(unit, 'lab.conf', `[Service]\nExecStart=\nExecStart=${execStart ?? 'missing'} --allowed-uids ${AGENT_USER},root\n`);
  }
  const tmpfilesConf = join(work, 'tmpfiles.conf');
  const tmpfiles = readFileSync(join(root, 'etc/tmpfiles.d/agent-connectors.conf'), 'utf8');
  writeFileSync(tmpfilesConf, tmpfiles.split('\n').filter((l) => !/\s\/etc\//.test(` ${l}`)).join('\n'));
  return Object.assign(partial, { work, unitDir, appDir: join(root, LIB_DIR), tmpfilesConf, svc, agent: await ensureSystemUser(AGENT_USER), dropIn });
}

/**
 * A folder inside the lab's app directory (seen in the lab under LIB_DIR) holding the
 * checkout's whole node_modules, for a script the agent runs that needs a dev dependency
 * (the MCP SDK): the installed package ships production dependencies only, and the
 * checkout itself may be closed to the agent UID (under /root, or a 0700 mktemp -d).
 * Hard links when the checkout and the scratch root share a file system, else a copy.
 * Returns its name under the app directory.
 */
export async function devModulesDir(t: TapTest, pkg: LabPackage): Promise<string | undefined> {
  const name = 'lab-dev';
  const dir = join(pkg.appDir, name);
  mkdirSync(dir, { mode: 0o755 });
  // realpath: a checkout's node_modules may itself be a link (a git worktree's to the main one).
  const from = realpathSync(join(REPO_ROOT, 'node_modules'));
  for (const flags of ['-al', '-a']) {
    const r = await run('cp', [flags, from, join(dir, 'node_modules')], { timeoutMs: 120_000 });
    if (r.code === 0) return name;
    rmSync(join(dir, 'node_modules'), { recursive: true, force: true });
    if (flags === '-a') t.fail(`copying the checkout's node_modules into the lab's app directory failed (${r.code}): ${r.stderr}`);
  }
  return undefined;
}

let installed: Promise<RunResult & { root: string }> | undefined;

/**
 * `install` into a scratch root, once per process: the labs of one file share it (each a
 * hard-linked copy). Install copies production's node_modules only since it reads the
 * lockfile (about 2 s on the test VM; the whole node_modules had taken 15 to 30 s a lab),
 * but the labs still need not wait for it twice. The tree stays until the process exits.
 */
function installedOnce(): Promise<RunResult & { root: string }> {
  installed ??= (async () => {
    const dir = tempDir('ac-lab-install-');
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
    const root = join(dir, 'root');
    const r = await run(process.execPath, [CLI, 'install', '--root', root, '--prefix', PREFIX, '--node', process.execPath, '--no-activate'], { timeoutMs: 120_000 });
    return { ...r, root };
  })();
  return installed;
}

/** One teardown, in this order: end the lab, show its logs if anything failed, clean up. */
function keepLogsOnFailure(t: TapTest, pkg: LabPackage): void {
  t.teardown(async () => {
    const lab = pkg.lab;
    if (lab && pkg.journalAtEnd === undefined) {
      pkg.journalAtEnd = (await lab.exec('journalctl --no-pager -o short-monotonic -u "agent-connectors*"')).stdout;
      await lab.shutdown();
    }
    if (t.passing()) {
      rmSync(pkg.scratch, { recursive: true, force: true });
      return;
    }
    // Keep the logs for a look, drop the installed package copy.
    rmSync(join(pkg.root, PREFIX), { recursive: true, force: true });
    t.comment(`lab scratch dir (kept): ${pkg.scratch}`);
    if (!lab) return;
    t.comment(`---- lab script output ----\n${lab.output.join('\n')}`);
    t.comment(`---- systemd console (last 200 lines, ${lab.consoleLogPath}) ----\n${lab.consoleLog().split('\n').slice(-200).join('\n')}`);
    t.comment(`---- journal (last 200 lines) ----\n${(pkg.journalAtEnd ?? '').split('\n').slice(-200).join('\n')}`);
  });
}
