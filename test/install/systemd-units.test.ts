import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import t from 'tap';
import { CLI, REPO_ROOT } from '../support/cli-proc.js';
import { exposureScore, run, systemdVersion, VERIFY_UNITS, verifySkipReason } from '../support/lab.js';
import { tempDir } from '../support/temp-dir.js';
import { renderUnit } from '../../src/install/install.js';
import { PART_NAMES, PART_NODE_FLAGS, PART_UNITS } from '../../src/data/package-parts.js';
import { unlessMissing } from '../tools/prerequisite.js';

/**
 * The shipped units/ without booting anything: `systemd-analyze verify` of every rendered
 * unit (any output fails), each service's `systemd-analyze security` exposure against its
 * recorded value, and `install` / `uninstall` into a scratch root.
 */

const UNITS = join(REPO_ROOT, 'units');
const UNIT_NAMES = readdirSync(UNITS)
  .filter((n) => /\.(service|socket|path|timer|target)$/.test(n))
  .sort();
const SERVICES = UNIT_NAMES.filter((n) => n.endsWith('.service'));
const SCORES_FILE = join(REPO_ROOT, 'contract-tests/fixtures/security-scores.json');

interface RecordedScores {
  systemdVersion: string;
  maxScore: number;
  scores: Record<string, number>;
}

/** Renders every unit the way `install` does, into a fresh directory. */
function renderAll(libDir: string, node: string): string {
  const dir = tempDir('ac-units-');
  for (const name of UNIT_NAMES) {
    writeFileSync(join(dir, name), renderUnit(readFileSync(join(UNITS, name), 'utf8'), libDir, node), { mode: 0o644 });
  }
  return dir;
}

/** Every file and symlink under `root` (relative paths), directories left out. */
function filesUnder(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        // The installed package is checked on its own; listing node_modules is noise.
        if (e.name === 'node_modules') out.push(`${p.slice(root.length)}/`);
        else walk(p);
      } else out.push(p.slice(root.length));
    }
  };
  if (existsSync(root)) walk(root);
  return out.sort();
}

interface Action {
  dry: boolean;
  what: string;
  path: string;
}

/** The `install`/`uninstall` report: one `[would ]<what>  <path>` line per action. */
function actionsOf(stdout: string): Action[] {
  const out: Action[] = [];
  for (const line of stdout.split('\n')) {
    const m = /^(would )?(\S.*?)\s{2,}(\S+)$/.exec(line);
    if (m) out.push({ dry: Boolean(m[1]), what: m[2] as string, path: m[3] as string });
  }
  return out;
}

const skip = verifySkipReason();
const skipOption = unlessMissing(t, skip);

t.test('every unit renders and passes systemd-analyze verify with no output', { skip: skipOption }, async (t) => {
  t.same(UNIT_NAMES.filter((n) => n.endsWith('.target')).length, 1, 'one target groups the services');
  const dir = renderAll(REPO_ROOT, process.execPath);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  for (const name of UNIT_NAMES) {
    const text = readFileSync(join(dir, name), 'utf8');
    t.notMatch(text, /@[A-Z]+@/, `${name}: no placeholder left after rendering`);
  }
  const r = await run(VERIFY_UNITS, UNIT_NAMES.map((n) => join(dir, n)));
  t.equal(r.code, 0, 'verify-units.sh exits 0');
  t.equal(r.stderr, '', 'nothing on stderr');
  t.equal(r.stdout.trim(), `verify: clean (${UNIT_NAMES.length} units)`, `no warning for any of the ${UNIT_NAMES.length} units:\n${r.stdout}`);
});

t.test('each service keeps its recorded systemd-analyze security exposure (≤ 2.0)', { skip: skipOption }, async (t) => {
  const recorded = JSON.parse(readFileSync(SCORES_FILE, 'utf8')) as RecordedScores;
  const version = await systemdVersion();
  const sameVersion = version === recorded.systemdVersion;
  if (!sameVersion) t.comment(`systemd ${version} here, scores recorded under ${recorded.systemdVersion}: only the ${recorded.maxScore} ceiling is checked`);
  t.same(Object.keys(recorded.scores).sort(), SERVICES, 'a recorded score for every service in units/, and for no other');
  const dir = renderAll(REPO_ROOT, process.execPath);
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const summary: string[] = [];
  for (const name of SERVICES) {
    const { score, output } = await exposureScore(join(dir, name));
    if (score === undefined) {
      t.fail(`${name}: no exposure score in the output:\n${output}`);
      continue;
    }
    summary.push(`${name} ${score.toFixed(1)}`);
    t.ok(score <= recorded.maxScore, `${name}: exposure ${score} ≤ ${recorded.maxScore}`);
    const was = recorded.scores[name];
    if (sameVersion && was !== undefined) {
      t.ok(score <= was, `${name}: exposure ${score} is not above the recorded ${was}`, score > was ? { found: score, wanted: `≤ ${was}`, output } : {});
      if (score < was) t.comment(`${name}: exposure went down from ${was} to ${score}; record the new value in ${SCORES_FILE}`);
    }
  }
  t.comment(`exposure (systemd ${version}): ${summary.join(', ')}`);
});

/** The resource limits docs/units.md's table gives each unit: { unit stem: { key: value } }. */
function documentedLimits(): Map<string, Record<string, string>> {
  const doc = readFileSync(join(REPO_ROOT, 'docs/units.md'), 'utf8');
  const out = new Map<string, Record<string, string>>();
  for (const m of doc.matchAll(/^\| ([a-z-]+) \| [^|]+ \| [^|]+ \| (\S+) \| (\S+) \| (\S+) \|$/gm)) {
    out.set(m[1] as string, { MemoryMax: m[2] as string, LimitNOFILE: m[3] as string, TasksMax: m[4] as string });
  }
  return out;
}

t.test('every service sets MemoryMax=, LimitNOFILE= and TasksMax=, as docs/units.md documents them', async (t) => {
  const documented = documentedLimits();
  for (const name of SERVICES) {
    const text = readFileSync(join(UNITS, name), 'utf8');
    const service = text.slice(text.indexOf('[Service]'), text.indexOf('[Install]'));
    const set: Record<string, string> = {};
    for (const key of ['MemoryMax', 'LimitNOFILE', 'TasksMax']) {
      const m = new RegExp(`^${key}=(\\S+)$`, 'm').exec(service);
      t.ok(m, `${name}: ${key}= in [Service]`);
      if (m?.[1]) set[key] = m[1];
    }
    const stem = name.replace(/^agent-connectors-/, '').replace(/\.service$/, '');
    t.same(set, documented.get(stem) ?? {}, `${name}: the values docs/units.md's "Resource limits" table gives`);
  }
});

/** A unit's ExecStart= words: node, its own flags, the CLI, the CLI's arguments. */
function execStart(text: string): { node: string; nodeFlags: string[]; cli: string; args: string[] } | undefined {
  const words = /^ExecStart=(.+)$/m.exec(text)?.[1]?.split(/\s+/);
  const cliAt = words?.findIndex((w) => w.endsWith('/dist/cli.js')) ?? -1;
  if (!words || cliAt < 1) return undefined;
  return { node: words[0] as string, nodeFlags: words.slice(1, cliAt), cli: words[cliAt] as string, args: words.slice(cliAt + 1) };
}

t.test("each part's unit runs node with the flags PART_NODE_FLAGS gives it, and no other", async (t) => {
  t.same(Object.values(PART_UNITS).sort(), SERVICES, 'every service is a part, every part a service');
  for (const part of PART_NAMES) {
    const unit = PART_UNITS[part];
    const exec = execStart(readFileSync(join(UNITS, unit), 'utf8'));
    t.ok(exec, `${unit}: ExecStart=@NODE@ [flags] @LIBDIR@/dist/cli.js …`);
    if (!exec) continue;
    t.equal(exec.node, '@NODE@', `${unit}: runs @NODE@`);
    t.equal(exec.cli, '@LIBDIR@/dist/cli.js', `${unit}: runs the package's CLI`);
    t.same(exec.nodeFlags, PART_NODE_FLAGS[part], `${unit}: node's flags are PART_NODE_FLAGS.${part}`);
    t.ok(
      exec.nodeFlags.every((f) => /^--[a-z0-9-]+(=[A-Za-z0-9._-]+)?$/.test(f)),
      `${unit}: each flag is one plain --name[=value] word (systemd splits ExecStart= on spaces)`,
    );
  }
});

t.test('the rendered units carry the node flags between the node binary and the CLI', async (t) => {
  const libDir = '/usr/lib/agent-connectors';
  const node = '/usr/lib/agent-connectors/node/bin/node';
  for (const part of PART_NAMES) {
    const rendered = renderUnit(readFileSync(join(UNITS, PART_UNITS[part]), 'utf8'), libDir, node);
    const exec = execStart(rendered);
    t.same(exec && [exec.node, ...exec.nodeFlags, exec.cli], [node, ...PART_NODE_FLAGS[part], `${libDir}/dist/cli.js`], `${PART_UNITS[part]} rendered`);
  }
});

t.test('install --root writes the package, units, sysusers and tmpfiles; --dry-run only reports; uninstall reverses it', async (t) => {
  const root = tempDir('ac-install-');
  const dryRoot = tempDir('ac-install-dry-');
  t.teardown(() => {
    rmSync(root, { recursive: true, force: true });
    rmSync(dryRoot, { recursive: true, force: true });
  });
  const prefix = '/usr/local';
  const libDir = `${prefix}/lib/agent-connectors`;
  const at = (p: string): string => join(root, p);
  const expected: Array<[string, string]> = [
    ['replace package', libDir],
    ['link CLI', `${prefix}/bin/agent-connectors`],
    ...UNIT_NAMES.map((n): [string, string] => ['write unit', `/etc/systemd/system/${n}`]),
    ['write config', '/etc/sysusers.d/agent-connectors.conf'],
    ['write config', '/etc/tmpfiles.d/agent-connectors.conf'],
    ['write agent users', '/etc/agent-connectors/agent-users'],
  ];

  await t.test('install --no-activate', async (t) => {
    const r = await run(process.execPath, [CLI, 'install', '--root', root, '--no-activate', '--node', process.execPath, '--agent-user', 'alice', '--agent-user', '1001'], { timeoutMs: 120_000 });
    t.equal(r.code, 0, `install exits 0${r.code === 0 ? '' : `: ${r.stderr}`}`);
    const actions = actionsOf(r.stdout);
    t.same(actions.map((a) => [a.what, a.path]), expected, 'it reports each action, in order, with its path');
    t.ok(actions.every((a) => !a.dry), 'no action is reported as "would"');
    t.notOk(actions.some((a) => /^(create|reload)/.test(a.what)), 'nothing activated (sysusers, tmpfiles, daemon-reload) under a scratch root');
    t.match(r.stdout, /systemctl enable --now agent-connectors\.target/, 'it says what to do next');
    t.match(r.stdout, /^Next: agent-connectors enroll --gateway URL /m, 'next is enroll, not a credential pasted by hand');
    t.notMatch(r.stdout, /renew-fetch\.env|put the host credential/, 'nothing sends the operator to write the credential or env file by hand');

    for (const name of UNIT_NAMES) {
      const file = at(`/etc/systemd/system/${name}`);
      t.equal(readFileSync(file, 'utf8'), renderUnit(readFileSync(join(UNITS, name), 'utf8'), libDir, process.execPath), `${name} rendered for ${libDir}`);
      t.equal(statSync(file).mode & 0o777, 0o644, `${name} is 0644`);
    }
    for (const conf of ['sysusers.d', 'tmpfiles.d']) {
      t.equal(readFileSync(at(`/etc/${conf}/agent-connectors.conf`), 'utf8'), readFileSync(join(UNITS, conf, 'agent-connectors.conf'), 'utf8'), `${conf} file installed unchanged`);
    }
    for (const part of ['package.json', 'README.md', 'dist/cli.js', 'units/agent-connectors.target', 'node_modules/commander/package.json']) {
      t.ok(existsSync(at(`${libDir}/${part}`)), `package part ${part} installed`);
    }
    const users = readFileSync(at('/etc/agent-connectors/agent-users'), 'utf8');
    t.match(users, /^# Local users whose agents may call/, 'the agent-users file says what it is');
    t.match(users, /^alice\n1001\n$/m, 'and names each --agent-user');
    const link = at(`${prefix}/bin/agent-connectors`);
    t.ok(lstatSync(link).isSymbolicLink(), 'the CLI is a symlink');
    t.equal(resolve(dirname(link), readlinkSync(link)), at(`${libDir}/dist/cli.js`), 'it points at the installed cli.js (relative, so it works under any root)');

    const help = await run(process.execPath, [at(`${libDir}/dist/cli.js`), '--help']);
    t.equal(help.code, 0, 'the installed copy runs on its own (its dist and node_modules are complete)');
    t.match(help.stdout, /forwarder/, 'and knows its commands');

    const verify = await run(VERIFY_UNITS, UNIT_NAMES.map((n) => at(`/etc/systemd/system/${n}`)));
    if (skip) t.comment(`installed units not verified: ${skip}`);
    else t.equal(verify.stdout.trim(), `verify: clean (${UNIT_NAMES.length} units)`, `the installed units verify clean:\n${verify.stdout}${verify.stderr}`);
  });

  await t.test('install --dry-run prints every action and changes nothing', async (t) => {
    const r = await run(process.execPath, [CLI, 'install', '--root', dryRoot, '--dry-run', '--node', process.execPath]);
    t.equal(r.code, 0, 'exits 0');
    const actions = actionsOf(r.stdout);
    t.same(actions.map((a) => [a.what, a.path]), expected, 'the same actions as a real install');
    t.ok(actions.length > 0 && actions.every((a) => a.dry), 'each one reported as "would …"');
    t.same(readdirSync(dryRoot), [], 'nothing was written');
  });

  const planted = ['/var/lib/agent-connectors/keep', '/var/lib/private/agent-connectors-link/state.json', '/var/lib/agent-connectors-shims/gh'];
  const expectedRemovals: Array<[string, string]> = [
    ...UNIT_NAMES.map((n): [string, string] => ['remove unit', `/etc/systemd/system/${n}`]),
    ['remove config', '/etc/sysusers.d/agent-connectors.conf'],
    ['remove config', '/etc/tmpfiles.d/agent-connectors.conf'],
    ['remove CLI link', `${prefix}/bin/agent-connectors`],
    ['remove package', libDir],
  ];

  await t.test('uninstall removes what install wrote and leaves state alone', async (t) => {
    for (const p of planted) {
      mkdirSync(dirname(at(p)), { recursive: true });
      writeFileSync(at(p), 'state\n');
    }
    const before = filesUnder(root);
    const dry = await run(process.execPath, [CLI, 'uninstall', '--root', root, '--dry-run']);
    t.equal(dry.code, 0, 'uninstall --dry-run exits 0');
    t.same(actionsOf(dry.stdout).map((a) => [a.what, a.path]), expectedRemovals, 'dry run lists every removal');
    t.ok(actionsOf(dry.stdout).every((a) => a.dry), 'as "would …"');
    t.same(filesUnder(root), before, 'and removes nothing');

    const r = await run(process.execPath, [CLI, 'uninstall', '--root', root]);
    t.equal(r.code, 0, 'uninstall exits 0');
    t.same(actionsOf(r.stdout).map((a) => [a.what, a.path]), expectedRemovals, 'it reports each removal');
    t.same(filesUnder(root), [...planted, '/etc/agent-connectors/agent-users'].sort(), 'only the state and the operator\'s agent-users file are left');

    const again = await run(process.execPath, [CLI, 'uninstall', '--root', root]);
    t.equal(again.code, 0, 'a second uninstall exits 0');
    t.match(again.stdout, /nothing to do/, 'and has nothing to do');
  });

  await t.test('uninstall --purge also removes the state', async (t) => {
    const r = await run(process.execPath, [CLI, 'uninstall', '--root', root, '--purge']);
    t.equal(r.code, 0, 'exits 0');
    t.same(
      actionsOf(r.stdout).map((a) => [a.what, a.path]),
      [
        ['purge config', '/etc/agent-connectors/agent-users'],
        ['purge state', '/var/lib/agent-connectors'],
        ['purge state', '/var/lib/agent-connectors-shims'],
        ['purge state', '/var/lib/private/agent-connectors-link'],
      ],
      'it reports the purge of the state directories and the shim directory',
    );
    t.same(filesUnder(root), [], 'nothing is left');
  });
});

t.test('an upgrade removes a unit an earlier version installed (the .path trigger of a one-shot apply)', async (t) => {
  const root = tempDir('ac-upgrade-');
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const retired = join(root, '/etc/systemd/system/agent-connectors-renew-apply.path');
  mkdirSync(dirname(retired), { recursive: true });
  writeFileSync(retired, '[Path]\nPathChanged=/var/lib/agent-connectors/handoff/inbox\n');
  const r = await run(process.execPath, [CLI, 'install', '--root', root, '--no-activate', '--node', process.execPath], { timeoutMs: 120_000 });
  t.equal(r.code, 0, `install exits 0${r.code === 0 ? '' : `: ${r.stderr}`}`);
  t.match(r.stdout, /remove retired unit\s+\/etc\/systemd\/system\/agent-connectors-renew-apply\.path/, 'it says so');
  t.notOk(existsSync(retired), 'the retired unit is gone');
  t.match(readFileSync(join(root, '/etc/systemd/system/agent-connectors.target'), 'utf8'), /agent-connectors-renew-apply\.service/, 'the target now wants the apply service');
});

t.test('an upgrade from 0.1.0 moves renew-fetch to the link: enablement, drop-ins, state, env file', async (t) => {
  const root = tempDir('ac-upgrade-link-');
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const at = (p: string): string => join(root, p);
  const sys = '/etc/systemd/system';
  const plant = (path: string, text: string, mode = 0o644): void => {
    mkdirSync(dirname(at(path)), { recursive: true });
    writeFileSync(at(path), text, { mode });
  };
  // 0.1.0 as `install` left it, enabled on its own, with a drop-in and a renewal in flight.
  plant(`${sys}/agent-connectors-renew-fetch.service`, '[Service]\nExecStart=/bin/true\n');
  mkdirSync(at(`${sys}/agent-connectors.target.wants`), { recursive: true });
  symlinkSync(`${sys}/agent-connectors-renew-fetch.service`, at(`${sys}/agent-connectors.target.wants/agent-connectors-renew-fetch.service`));
  plant(`${sys}/agent-connectors-renew-fetch.service.d/metrics.conf`, '[Service]\nEnvironment=AGENT_CONNECTORS_METRICS_LISTEN=127.0.0.1:14327\n');
  plant('/var/lib/private/agent-connectors-renew-fetch/renew-fetch/slots/instance:a.json', '{"requestId":"r-1"}\n', 0o600);
  symlinkSync('private/agent-connectors-renew-fetch', at('/var/lib/agent-connectors-renew-fetch'));
  plant('/etc/agent-connectors/link.env', 'AGENT_CONNECTORS_GATEWAY_URL=https://gw.example\nAGENT_CONNECTORS_HOST_ID=host-1\n');
  plant('/etc/agent-connectors/renew-fetch.env', '# the operator\'s\nAGENT_CONNECTORS_GATEWAY_URL=https://old.example\nHTTPS_PROXY=http://proxy:3128\n', 0o600);

  const r = await run(process.execPath, [CLI, 'install', '--root', root, '--no-activate', '--node', process.execPath], { timeoutMs: 120_000 });
  t.equal(r.code, 0, `install exits 0${r.code === 0 ? '' : `: ${r.stderr}`}`);
  const moves = actionsOf(r.stdout).filter((a) => !/^(replace package|link CLI|write |add agent users)/.test(a.what));
  t.same(moves.map((a) => [a.what, a.path]), [
    ['move enablement link', `${sys}/agent-connectors.target.wants/agent-connectors-renew-fetch.service`],
    ['move drop-ins', `${sys}/agent-connectors-link.service.d`],
    ['move state', '/var/lib/private/agent-connectors-link'],
    ['remove state link', '/var/lib/agent-connectors-renew-fetch'],
    ['merge env file', '/etc/agent-connectors/link.env'],
    ['remove retired unit', `${sys}/agent-connectors-renew-fetch.service`],
  ], 'it reports each move, in order');
  t.equal(readlinkSync(at(`${sys}/agent-connectors.target.wants/agent-connectors-link.service`)), `${sys}/agent-connectors-link.service`, 'the link is enabled where the old unit was');
  t.notOk(existsSync(at(`${sys}/agent-connectors.target.wants/agent-connectors-renew-fetch.service`)), "the old unit's enablement link is gone");
  t.notOk(existsSync(at(`${sys}/agent-connectors-renew-fetch.service`)), 'and its unit file');
  t.match(readFileSync(at(`${sys}/agent-connectors-link.service.d/metrics.conf`), 'utf8'), /METRICS_LISTEN/, "the operator's drop-in now applies to the link");
  t.equal(readFileSync(at('/var/lib/private/agent-connectors-link/renew-fetch/slots/instance:a.json'), 'utf8'), '{"requestId":"r-1"}\n', 'the state directory moved whole (the link renames renew-fetch/ inside at start)');
  t.notOk(existsSync(at('/var/lib/private/agent-connectors-renew-fetch')), 'nothing left under the old name');
  t.notOk(lstatSync(at('/var/lib/agent-connectors-renew-fetch'), { throwIfNoEntry: false }), 'nor its /var/lib link');
  t.equal(
    readFileSync(at('/etc/agent-connectors/link.env'), 'utf8'),
    'AGENT_CONNECTORS_GATEWAY_URL=https://gw.example\nAGENT_CONNECTORS_HOST_ID=host-1\n' +
      '# From renew-fetch.env (agent-connectors 0.1.0), merged on upgrade; docs/packaging.md.\n' +
      "# the operator's\n# (link.env sets AGENT_CONNECTORS_GATEWAY_URL above) AGENT_CONNECTORS_GATEWAY_URL=https://old.example\nHTTPS_PROXY=http://proxy:3128\n",
    "link.env keeps its own keys, gains renew-fetch.env's others, and every line",
  );
  t.equal(statSync(at('/etc/agent-connectors/link.env')).mode & 0o777, 0o600, 'with the stricter mode of the two');
  t.notOk(existsSync(at('/etc/agent-connectors/renew-fetch.env')), 'renew-fetch.env is gone');

  const again = await run(process.execPath, [CLI, 'install', '--root', root, '--no-activate', '--node', process.execPath], { timeoutMs: 120_000 });
  t.equal(again.code, 0, 'a second install exits 0');
  t.notMatch(again.stdout, /move|merge|remove/, 'and has nothing left to move');
});
