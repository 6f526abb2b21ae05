import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t from 'tap';
import { CLI, REPO_ROOT } from '../test/support/cli-proc.js';
import { tempDir } from '../test/support/temp-dir.js';

/**
 * What a CLI call loads (docs/performance.md, "CLI start"): `--version` no command, each
 * command only its own group, `doctor` and `status` their checks only when they run. Checked
 * on the set of modules node loads, which a load hook records; never on time.
 */
const DIST = pathToFileURL(join(REPO_ROOT, 'dist')).href;
const dir = tempDir('ac-cli-start-', t);
const hooks = join(dir, 'hooks.mjs');
writeFileSync(
  hooks,
  "import { appendFileSync } from 'node:fs';\n" +
    'export async function load(url, context, next) {\n' +
    "  appendFileSync(process.env.MODULES_LOG, url + '\\n');\n" +
    '  return next(url, context);\n' +
    '}\n',
);
const register = join(dir, 'register.mjs');
writeFileSync(register, `import { register } from 'node:module';\nregister(${JSON.stringify(pathToFileURL(hooks).href)});\n`);

/** Bound on what is kept of a child's stdout: a help text is a few KiB. */
const MAX_OUT = 256 * 1024;
let runs = 0;

/**
 * Runs the built CLI (env -i: tap's loader would add its own modules) and lists the dist/
 * modules it loaded, and the packages (node_modules/<name>) it loaded any module of.
 */
function cli(args: string[]): Promise<{ code: number | null; stdout: string; modules: string[]; packages: string[] }> {
  const log = join(dir, `modules-${++runs}.log`);
  writeFileSync(log, '');
  const env = [`PATH=${process.env.PATH ?? ''}`, `MODULES_LOG=${log}`];
  return new Promise((resolve, reject) => {
    const child = spawn('/usr/bin/env', ['-i', ...env, process.execPath, '--import', register, CLI, ...args], { env: {}, stdio: ['ignore', 'pipe', 'ignore'] });
    let stdout = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => {
      if (stdout.length < MAX_OUT) stdout += c;
    });
    child.on('error', reject);
    child.on('close', (code) => {
      const urls = [...new Set(readFileSync(log, 'utf8').split('\n'))];
      const modules = urls.filter((u) => u.startsWith(`${DIST}/`)).map((u) => u.slice(DIST.length + 1));
      const packages = [...new Set(urls.flatMap((u) => /\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(u)?.[1] ?? []))];
      resolve({ code, stdout, modules, packages });
    });
  });
}

/** The modules that declare a command group (src/cli/*-command.ts, *-commands.ts, src/dev/dev-command.ts). */
const groupsIn = (modules: string[]): string[] => modules.filter((m) => /^(cli\/[a-z-]+-commands?|dev\/dev-command)\.js$/.test(m)).sort();

t.test('--version loads no command group, and not errors.ts', async (t) => {
  const r = await cli(['--version']);
  t.equal(r.code, 0);
  t.match(r.stdout, /^\d+\.\d+\.\d+/, 'prints the version');
  t.same(r.modules.sort(), ['cli.js', 'version.js'], 'only the entry point and version.js from dist/');
});

t.test('every command listed by --help loads its own group, not all of them', async (t) => {
  const all = await cli(['--help']);
  t.equal(all.code, 0);
  const everyGroup = groupsIn(all.modules);
  t.ok(everyGroup.length >= 8, `--help loads every group (${everyGroup.length})`);
  const section = all.stdout.split(/^Commands:$/m)[1] ?? '';
  const commands = [...section.matchAll(/^ {2}([a-z][a-z-]*)/gm)].map((m) => m[1] ?? '').filter((c) => c !== 'help');
  t.ok(commands.length >= 10, `the help lists the commands (${commands.join(' ')})`);
  for (const command of commands) {
    const r = await cli([command, '--help']);
    t.equal(r.code, 0, `${command} --help exits 0`);
    t.match(r.stdout, new RegExp(`^Usage: agent-connectors ${command}\\b`), `${command} --help shows its own usage`);
    const loaded = groupsIn(r.modules);
    t.ok(loaded.length < everyGroup.length, `${command} --help loads ${loaded.join(', ')}; all groups would mean ${command} is missing from GROUPS in src/cli.ts`);
  }
});

t.test('doctor and status load their checks only when they run', async (t) => {
  for (const command of ['doctor', 'status']) {
    const r = await cli([command, '--help']);
    t.equal(r.code, 0);
    t.same(r.modules.filter((m) => m.startsWith('doctor/')), [], `${command} --help loads nothing of doctor/`);
    t.notOk(r.modules.includes('forwarder/forwarder-service.js') || r.modules.includes('cli-proxy/cli-proxy-service.js'), `${command} --help loads neither proxy`);
  }
  const state = tempDir('ac-cli-start-state-', t);
  const r = await cli(['status', '--no-systemd', '--json', '--state-dir', state]);
  t.equal(r.code, 0, 'status runs');
  t.ok(r.modules.includes('doctor/status.js'), 'and loads doctor/status.js to do it');
  t.ok(r.packages.includes('zod'), `the packages it loaded are seen (${r.packages.join(' ')})`);
  t.notOk(r.packages.includes('execa'), 'but no execa: without systemd it runs no program');
});

t.test('execa (a hundred modules) is loaded only to run a program: list runs none', async (t) => {
  const state = tempDir('ac-cli-start-state-', t);
  const r = await cli(['list', '--state-dir', state]);
  t.equal(r.code, 0, 'list runs');
  t.ok(r.packages.includes('commander'), `the packages it loaded are seen (${r.packages.join(' ')})`);
  t.notOk(r.packages.includes('execa'), 'list loads no execa');
});
