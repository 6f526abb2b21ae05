/**
 * The tarball for hosts without dpkg: the .deb's tree as it is, its maintainer scripts,
 * and install.sh / uninstall.sh that do what dpkg does with them (docs/packaging.md, "The
 * tarball"). The maintainer scripts are the .deb's own, filled in the same way, so the two
 * cannot drift: install.sh runs `postinst configure [old version]`, uninstall.sh runs
 * `prerm remove` and `postrm remove|purge`.
 */
import { chmod, cp, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { fill } from './template.js';

const PACKAGING = fileURLToPath(new URL('../../packaging', import.meta.url));
/** Inside the installed app directory: the scripts and the list of files outside it. */
export const MAINTAINER_DIR = 'maintainer';

/** Every file and link under `dir`, as absolute paths of the installed system. */
async function walk(root: string, dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(join(root, dir), { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await walk(root, path)));
    else out.push(`/${path}`);
  }
  return out;
}

export interface TarballOptions {
  /** The staged .deb root (usr/ and DEBIAN/). */
  root: string;
  debian: string;
  out: string;
  /** <package>_<version>_<arch>: the file's name and its top directory. */
  name: string;
  libDir: string;
  /** gzip's level, 1–9. */
  level: string;
}

export async function writeTarball(o: TarballOptions): Promise<string> {
  const stage = join(o.root, '..', 'tarball');
  const top = join(stage, o.name);
  await mkdir(top, { recursive: true });
  // Hard links: the tree is large (the runtime) and is not changed after this.
  await execa('cp', ['-al', join(o.root, 'usr'), join(top, 'usr')]);
  const lib = o.libDir.replace(/^\//, '');
  const maintainer = join(top, lib, MAINTAINER_DIR);
  await mkdir(maintainer, { mode: 0o755 });
  for (const script of ['postinst', 'prerm', 'postrm']) await cp(join(o.debian, script), join(maintainer, script));
  // What lies outside the app directory (the CLI, units, sysusers.d, tmpfiles.d): the app
  // directory is replaced whole, these one by one, and the next version removes those it no longer ships.
  const files = (await walk(top, 'usr')).filter((p) => !p.startsWith(`${o.libDir}/`)).sort();
  await writeFile(join(maintainer, 'files'), `${files.join('\n')}\n`, { mode: 0o644 });
  const slots = { LIBDIR: o.libDir, MAINTAINER: join(o.libDir, MAINTAINER_DIR) };
  for (const [template, dest] of [
    ['install.sh', join(top, 'install.sh')],
    ['uninstall.sh', join(maintainer, 'uninstall.sh')],
  ] as const) {
    const text = fill(await readFile(join(PACKAGING, template), 'utf8'), slots);
    await writeFile(dest, text, { mode: 0o755 });
    await chmod(dest, 0o755);
  }
  // gzip, not xz: a stock minbase Debian has no xz to unpack it with (the lab found that).
  const tarball = join(o.out, `${o.name}.tar.gz`);
  // Owners as the .deb has them (root), whoever builds.
  await execa('tar', ['--owner=0', '--group=0', '--numeric-owner', '--sort=name', '-C', stage, '-cf', tarball, '-I', `gzip -${o.level}`, relative(stage, top)]);
  return tarball;
}
