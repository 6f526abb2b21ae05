import { PACKAGE_PARTS } from '../data/package-parts.js';
import { chmod, lstat, mkdir, readdir, readFile, unlink } from 'node:fs/promises';
import { statSync } from 'node:fs';
import { isAbsolute, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Catalog } from '../data/catalog.js';
import { ConfigError } from '../errors.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { SYSTEM_SHIM_DIR } from '../data/state-layout.js';
import { renderShims, SHIM_MARKER } from './render.js';

export interface InstallResult {
  written: string[];
  removed: string[];
}

/**
 * Writes one executable (0755) per catalog command into `dir`, atomically, and removes
 * shims of ours that the catalog no longer names. Files that are not our shims are never
 * touched.
 */
export async function installShims(catalog: Catalog, dir: string, proxyUrl: string, caBundle?: string): Promise<InstallResult> {
  refuseInsidePackage(dir);
  // The Agent UID must be able to enter it whatever our umask (SPEC §2: 0755).
  if ((await mkdir(dir, { recursive: true, mode: 0o755 })) !== undefined) await chmod(dir, 0o755);
  const shims = renderShims(catalog, dir, proxyUrl, caBundle);
  const wanted = new Set(shims.map((s) => s.name));
  const written: string[] = [];
  for (const shim of shims) {
    await atomicWrite(join(dir, shim.name), shim.script, { mode: 0o755 });
    written.push(shim.name);
  }
  const removed: string[] = [];
  for (const name of await readdir(dir)) {
    if (wanted.has(name) || name.startsWith('.')) continue;
    // Only regular files: an operator's symlink to a shim is theirs, and a FIFO would block.
    if (!(await lstat(join(dir, name)).catch(() => undefined))?.isFile()) continue;
    const head = await readFile(join(dir, name), 'utf8').then((t) => t.slice(0, 200)).catch(() => '');
    // Ours only if the marker names this very file: the prototype (and any copy of it)
    // carries the marker too, with a placeholder for the name.
    if (head.includes(`${SHIM_MARKER} ${name} (provider `)) {
      await unlink(join(dir, name));
      removed.push(name);
    }
  }
  return { written, removed };
}

/** The installed package (dist/shims/install.js → the package root). */
const PACKAGE_ROOT = resolve(fileURLToPath(new URL('../../', import.meta.url)));

// What every upgrade replaces is PACKAGE_PARTS: shims there would vanish silently, and
// `shims/` holds the prototype, which the sweep once deleted.

/**
 * The sources: install and the .deb never copy them, so a package root holding them is a
 * checkout (a clone, a worktree, an unpacked source archive). An upgrade of a checkout
 * leaves its other directories alone (dev's ./.state is one); an installed package is
 * replaced whole (install removes its directory first).
 */
const SOURCE_DIR = 'src';

/** Why `dir` cannot hold shims for a package at `packageRoot`, or undefined if it can. */
export function shimDirRefusal(dir: string, packageRoot: string): string | undefined {
  const target = resolve(dir);
  const root = resolve(packageRoot);
  const inside = (base: string): boolean => {
    const rel = relative(base, target);
    return rel === '' || (rel !== '..' && !rel.startsWith(`..${sep}`) && !isAbsolute(rel));
  };
  if (!inside(root)) return undefined;
  const advice = `choose another --dir (default as root: ${SYSTEM_SHIM_DIR})`;
  if (!isDirectory(join(root, SOURCE_DIR)) || target === root) {
    return `the shim directory ${target} is inside the installed package (${root}), which an upgrade replaces; ${advice}`;
  }
  const part = PACKAGE_PARTS.find((p) => inside(join(root, p)));
  if (part === undefined) return undefined;
  return `the shim directory ${target} is inside the installed package's ${part} (${join(root, part)}), which an upgrade replaces; ${advice}`;
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

function refuseInsidePackage(dir: string): void {
  const reason = shimDirRefusal(dir, PACKAGE_ROOT);
  if (reason !== undefined) throw new ConfigError(reason);
}
