/**
 * `npm run package`: builds agent-connectors_<version>_all.deb with Debian's own dpkg-deb.
 *
 *   node build/packaging/build.js [--version V] [--out DIR]
 *
 * What goes where is install's vendor layout (src/install/install.ts), the same code
 * `agent-connectors install` runs; this script only adds production node_modules (npm ci
 * --omit=dev in a scratch directory, from npm's cache when it has them), the control file
 * and the maintainer scripts. Needs `npm run build` first (dist/). docs/packaging.md.
 */
import { chmod, cp, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { execa } from 'execa';
import { z } from 'zod';
import { TARGET_UNIT as TARGET } from '../src/data/unit-names.js';
import { install, PURGED_STATE, RETIRED_UNITS, unitFiles, vendorLayout } from '../src/install/install.js';

/** The checkout: build/packaging/build.js is two levels down. */
const REPO = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PACKAGING = join(REPO, 'packaging');
const MAINTAINER_SCRIPTS = ['postinst', 'prerm', 'postrm'] as const;
const NODE = '/usr/bin/node';

const packageJsonSchema = z.looseObject({ name: z.string(), version: z.string() });
/** Debian's version syntax (upstream[-revision], no epoch here). */
const debVersionSchema = z.string().regex(/^[0-9][A-Za-z0-9.+~-]*$/, 'a Debian version: digits first, then [A-Za-z0-9.+~-]');

function fill(template: string, values: Record<string, string>): string {
  return template.replace(/@([A-Z_]+)@/g, (whole, key: string) => {
    const value = values[key];
    if (value === undefined) throw new Error(`packaging template: no value for ${whole}`);
    return value;
  });
}

/** The users and groups the package's sysusers.d file creates: purge removes exactly those. */
function sysusersNames(text: string): { users: string[]; groups: string[] } {
  const users: string[] = [];
  const groups: string[] = [];
  for (const line of text.split('\n')) {
    const [type, name] = line.trim().split(/\s+/);
    if (!name) continue;
    // `u` creates a group of the same name too.
    if (type === 'u') users.push(name);
    if (type === 'u' || type === 'g') groups.push(name);
  }
  return { users, groups };
}

async function duKiB(dir: string): Promise<number> {
  const r = await execa('du', ['-sk', '--apparent-size', dir]);
  return Number(String(r.stdout).split(/\s/)[0]);
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { version: { type: 'string' }, out: { type: 'string' } } });
  const pkg = packageJsonSchema.parse(JSON.parse(await readFile(join(REPO, 'package.json'), 'utf8')));
  const version = debVersionSchema.parse(values.version ?? pkg.version);
  const out = resolve(values.out ?? REPO);
  if (!(await stat(join(REPO, 'dist', 'cli.js')).catch(() => undefined))) throw new Error('no dist/cli.js: run `npm run build` first');

  const scratch = await mkdtemp(join(tmpdir(), 'ac-package-'));
  try {
    // Production dependencies exactly as the lockfile pins them; scripts off (`prepare`
    // would build, and no dependency needs an install script).
    const modules = join(scratch, 'modules');
    await mkdir(modules);
    for (const f of ['package.json', 'package-lock.json']) await cp(join(REPO, f), join(modules, f));
    await execa('npm', ['ci', '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund', '--prefer-offline'], { cwd: modules, stdio: ['ignore', 'pipe', 'inherit'] });
    // The root .bin links only dev tools' entry points, none of which is shipped.
    await rm(join(modules, 'node_modules', '.bin'), { recursive: true, force: true });

    const root = join(scratch, 'root');
    const l = vendorLayout();
    await install({ prefix: '/usr', root, node: NODE, dryRun: false, activate: false, layout: l, from: REPO, nodeModules: join(modules, 'node_modules'), writeAgentUsers: false });
    // The version the package says is the one the app reports (--version, /healthz).
    const shippedPkg = join(root, l.libDir, 'package.json');
    await writeFile(shippedPkg, `${JSON.stringify({ ...packageJsonSchema.parse(JSON.parse(await readFile(shippedPkg, 'utf8'))), version }, null, 2)}\n`);

    // /etc is the operator's (docs/packaging.md: no conffiles): should install() ever write
    // a file there, it must not end up in the package, where dpkg would own it.
    const outside = (await readdir(root)).filter((name) => name !== 'usr');
    if (outside.length > 0) throw new Error(`the staged package has files outside /usr: ${outside.join(', ')}`);
    const units = await unitFiles(REPO);
    const { users, groups } = sysusersNames(await readFile(join(REPO, 'units/sysusers.d/agent-connectors.conf'), 'utf8'));
    const slots: Record<string, string> = {
      VERSION: version,
      INSTALLED_SIZE: String(await duKiB(root)),
      SERVICES: units.filter((u) => u.endsWith('.service')).join(' '),
      // Purge removes the enablement links of 0.1.0's unit names too.
      UNITS: [...units, ...RETIRED_UNITS].join(' '),
      TARGET,
      CLI: `${NODE} ${join(l.libDir, 'dist', 'cli.js')}`,
      SYSUSERS: l.sysusers,
      TMPFILES: l.tmpfiles,
      PURGED: PURGED_STATE.join(' '),
      USERS: users.join(' '),
      GROUPS: groups.join(' '),
    };
    if (!units.includes(TARGET)) throw new Error(`units/ has no ${TARGET}`);
    const debian = join(root, 'DEBIAN');
    await mkdir(debian, { mode: 0o755 });
    await writeFile(join(debian, 'control'), fill(await readFile(join(PACKAGING, 'control'), 'utf8'), slots), { mode: 0o644 });
    for (const script of MAINTAINER_SCRIPTS) {
      await writeFile(join(debian, script), fill(await readFile(join(PACKAGING, script), 'utf8'), slots));
      await chmod(join(debian, script), 0o755);
    }
    // dpkg-deb refuses group- or world-writable control files; npm's tree is 0644/0755 already.
    await chmod(root, 0o755);

    await mkdir(out, { recursive: true });
    const deb = join(out, `${pkg.name}_${version}_all.deb`);
    await execa('dpkg-deb', ['--root-owner-group', '--build', root, deb], { stdio: ['ignore', 'pipe', 'inherit'] });
    const size = (await stat(deb)).size;
    process.stdout.write(`${deb}\n${basename(deb)}: ${(size / 1024 / 1024).toFixed(1)} MiB (${size} bytes), installed ${slots.INSTALLED_SIZE} KiB\n`);
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`npm run package: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
