/**
 * `npm run package`: builds agent-connectors_<version>_<arch>.deb with Debian's own
 * dpkg-deb, and with --tarball the same tree as agent-connectors_<version>_<arch>.tar.gz
 * for hosts without dpkg.
 *
 *   node build/packaging/build.js [--arch amd64|arm64|all] [--version V] [--out DIR] [--tarball] [--fast]
 *
 * --fast: xz (and the tarball's gzip) level 1 instead of 6 (the labs and gates: the same files, a few MiB larger,
 * minutes less on a busy machine; xz -6 of the 136 MiB tree took over 12 min at a load of 20).
 *
 * amd64 and arm64 carry their Node (packaging/node-runtime.ts, docs/design/carried-runtime.md)
 * under /usr/lib/agent-connectors/node and depend only on systemd and the C/C++ runtime
 * libraries; `all` is the variant on the system's Node (Depends: nodejs (>= 20.19)). The
 * default is this machine's architecture. Every architecture is the same build (dist/,
 * node_modules: nothing compiled); only the runtime differs.
 *
 * What goes where is install's vendor layout (src/install/install.ts), the same code
 * `agent-connectors install` runs; this script only adds production node_modules (npm ci
 * --omit=dev in a scratch directory, from npm's cache when it has them), the runtime, the
 * control file and the maintainer scripts. Needs `npm run build` first (dist/). docs/packaging.md.
 */
import { chmod, copyFile, cp, mkdir, mkdtemp, readdir, readFile, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { execa } from 'execa';
import { z } from 'zod';
import { TARGET_UNIT as TARGET } from '../src/data/unit-names.js';
import { install, PURGED_STATE, RETIRED_UNITS, unitFiles, vendorLayout } from '../src/install/install.js';
import { ARCHES, fetchRuntime, hostArch, readRuntimePin, type Arch } from './node-runtime.js';
import { writeTarball } from './tarball.js';
import { fill } from './template.js';

/** The checkout: build/packaging/build.js is two levels down. */
const REPO = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const PACKAGING = join(REPO, 'packaging');
const MAINTAINER_SCRIPTS = ['postinst', 'prerm', 'postrm'] as const;
const SYSTEM_NODE = '/usr/bin/node';
/** Where the carried Node goes, beside the app it runs. */
const CARRIED_NODE_DIR = 'node';
/**
 * What the carried node binary needs beyond the kernel: its NEEDED libraries' packages, at
 * the newest symbol versions it uses (objdump -T on both architectures' bin/node of the
 * pinned release: GLIBC_2.28, GCC_3.4, GLIBCXX_3.4.21, CXXABI_1.3.11 (GCC 7)). Every
 * Debian since 10 and Ubuntu since 20.04 has them installed.
 */
const CARRIED_DEPENDS = 'libc6 (>= 2.28), libgcc-s1 (>= 3.4), libstdc++6 (>= 7), systemd';
const SYSTEM_NODE_DEPENDS = 'nodejs (>= 20.19), systemd';

const packageJsonSchema = z.looseObject({ name: z.string(), version: z.string() });
/** Debian's version syntax (upstream[-revision], no epoch here). */
const debVersionSchema = z.string().regex(/^[0-9][A-Za-z0-9.+~-]*$/, 'a Debian version: digits first, then [A-Za-z0-9.+~-]');

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
  const { values } = parseArgs({ options: { version: { type: 'string' }, out: { type: 'string' }, arch: { type: 'string' }, tarball: { type: 'boolean' }, fast: { type: 'boolean' } } });
  const level = values.fast ? '1' : '6';
  const archArg = values.arch ?? (await hostArch());
  const arch = archArg === 'all' ? 'all' : ARCHES.find((a) => a === archArg);
  if (!arch) throw new Error(`--arch ${archArg}: one of ${ARCHES.join(', ')}, or all (the system's Node)`);
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
    const node = arch === 'all' ? SYSTEM_NODE : join(l.libDir, CARRIED_NODE_DIR, 'bin', 'node');
    await install({ prefix: '/usr', root, node, dryRun: false, activate: false, layout: l, from: REPO, nodeModules: join(modules, 'node_modules'), writeAgentUsers: false });
    const runtimeVersion = arch === 'all' ? undefined : await carryRuntime(arch, join(scratch, 'runtime'), join(root, l.libDir), join(root, l.binLink), node, join(l.libDir, 'dist', 'cli.js'));
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
      CLI: `${node} ${join(l.libDir, 'dist', 'cli.js')}`,
      ARCH: arch,
      DEPENDS: arch === 'all' ? SYSTEM_NODE_DEPENDS : CARRIED_DEPENDS,
      RUNTIME: runtimeVersion ? `Node ${runtimeVersion}, carried under ${join(l.libDir, CARRIED_NODE_DIR)}` : 'the system\'s Node (nodejs >= 20.19)',
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
    const deb = join(out, `${pkg.name}_${version}_${arch}.deb`);
    // xz with a thread per core: the carried runtime is over 100 MiB uncompressed.
    await execa('dpkg-deb', ['--root-owner-group', '-Zxz', `-z${level}`, '--threads-max=0', '--build', root, deb], { stdio: ['ignore', 'pipe', 'inherit'] }).catch(async (err: unknown) => {
      // dpkg before 1.21.9 has no --threads-max: the same build, one thread.
      if (!/threads-max/.test(String((err as { stderr?: unknown }).stderr ?? ''))) throw err;
      await execa('dpkg-deb', ['--root-owner-group', '-Zxz', `-z${level}`, '--build', root, deb], { stdio: ['ignore', 'pipe', 'inherit'] });
    });
    const size = (await stat(deb)).size;
    process.stdout.write(`${deb}\n${basename(deb)}: ${(size / 1024 / 1024).toFixed(1)} MiB (${size} bytes), installed ${slots.INSTALLED_SIZE} KiB\n`);
    if (values.tarball) {
      const tarball = await writeTarball({ root, debian, out, name: `${pkg.name}_${version}_${arch}`, libDir: l.libDir, level });
      const tsize = (await stat(tarball)).size;
      process.stdout.write(`${tarball}\n${basename(tarball)}: ${(tsize / 1024 / 1024).toFixed(1)} MiB (${tsize} bytes)\n`);
    }
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/**
 * The pinned Node for `arch` into `<libDir>/node` (bin/node and its LICENSE), and the CLI
 * on it: /usr/bin/agent-connectors becomes a two-line script, since a link to cli.js would
 * run its `#!/usr/bin/env node` on whatever node PATH finds (Debian 12's is 18).
 */
async function carryRuntime(arch: Arch, scratch: string, libDir: string, binLink: string, node: string, cli: string): Promise<string> {
  await mkdir(scratch, { recursive: true });
  const runtime = await fetchRuntime(await readRuntimePin(PACKAGING), arch, scratch);
  const dir = join(libDir, CARRIED_NODE_DIR);
  await mkdir(join(dir, 'bin'), { recursive: true, mode: 0o755 });
  await copyFile(runtime.node, join(dir, 'bin', 'node'));
  await chmod(join(dir, 'bin', 'node'), 0o755);
  await copyFile(runtime.license, join(dir, 'LICENSE'));
  await chmod(join(dir, 'LICENSE'), 0o644);
  await unlink(binLink);
  await writeFile(binLink, fill(await readFile(join(PACKAGING, 'agent-connectors.sh'), 'utf8'), { NODE: node, CLI: cli }), { mode: 0o755 });
  await chmod(binLink, 0o755);
  return runtime.version;
}

main().catch((err: unknown) => {
  process.stderr.write(`npm run package: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
