import { PACKAGE_PARTS } from '../data/package-parts.js';
import { chmod, lstat, mkdir, open, readdir, unlink } from 'node:fs/promises';
import { constants, statSync } from 'node:fs';
import { isAbsolute, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Catalog } from '../data/catalog.js';
import { ConfigError } from '../errors.js';
import { atomicWriteSync, fsyncDir, isTempName, sweepStaleTemps } from '../fs/atomic-write.js';
import { readBoundedRegularFile } from '../fs/bounded-read.js';
import { SYSTEM_SHIM_DIR } from '../data/state-layout.js';
import { renderShims, SHIM_MARKER } from './render.js';

export interface InstallResult {
  /** Every shim the catalog names, now in place. */
  written: string[];
  /** Of those, the ones whose file was (re)written: the rest were already exactly that. */
  changed: string[];
  removed: string[];
}

/**
 * Writes one executable (0755) per catalog command into `dir`, atomically, and sweeps
 * what no longer belongs there. The shim directory is agent-connectors' own (docs/shims.md):
 *   - a shim of ours the catalog no longer names is removed, whatever its name (an older
 *     release rendered dot names such as `.profile`, which `. .profile` sources from PATH);
 *   - every other dot entry that is not a directory is removed too: no command is a dot
 *     name, so none is ours to keep, and any of them could be sourced;
 *   - anything else (an operator's own file, a symlink alias, a directory) is left: a
 *     `--dir` set by mistake to /usr/local/bin must not lose its contents.
 * Our own temp files are left to `sweepStaleTemps`, which removes only a dead writer's.
 */
export async function installShims(catalog: Catalog, dir: string, proxyUrl: string, caBundle: string): Promise<InstallResult> {
  refuseInsidePackage(dir);
  // The Agent UID must be able to enter it whatever our umask (SPEC §2: 0755).
  if ((await mkdir(dir, { recursive: true, mode: 0o755 })) !== undefined) await chmod(dir, 0o755);
  const shims = renderShims(catalog, dir, proxyUrl, caBundle);
  const wanted = new Set(shims.map((s) => s.name));
  const written: string[] = [];
  const changed: string[] = [];
  // A reconcile renders every shim of the catalog; 1 000 providers' shims, each its own
  // atomic write with two fsyncs, took seconds on every change of the state, one binding
  // or all. A shim already in place as rendered is left; the others are written whole or
  // absent (temp + rename) without an fsync each, and one fsync of the directory makes the
  // renames durable. A shim a power loss emptied is rendered again at apply's next start.
  for (const [i, shim] of shims.entries()) {
    if (i > 0 && i % SYNC_BATCH === 0) await new Promise((r) => setImmediate(r));
    const path = join(dir, shim.name);
    written.push(shim.name);
    if (await isInPlace(path, shim.script)) continue;
    atomicWriteSync(path, shim.script, { mode: 0o755 });
    changed.push(shim.name);
  }
  if (changed.length > 0) await fsyncDir(dir);
  await sweepStaleTemps(dir);
  const removed: string[] = [];
  for (const name of await readdir(dir)) {
    if (wanted.has(name) || isTempName(name)) continue;
    const st = await lstat(join(dir, name)).catch(() => undefined);
    if (st === undefined || st.isDirectory()) continue;
    if (name.startsWith('.') || (st.isFile() && (await isOurShim(join(dir, name), name)))) {
      await unlink(join(dir, name));
      removed.push(name);
    }
  }
  return { written, changed, removed };
}

/** Between two runs of this many synchronous writes, the loop takes its other work. */
const SYNC_BATCH = 256;

/**
 * Whether `path` is already this shim: a regular file (not followed through a symlink),
 * ours (this UID), mode 0755, with exactly this text. Anything else is rewritten.
 */
async function isInPlace(path: string, script: string): Promise<boolean> {
  const bytes = Buffer.byteLength(script);
  try {
    const { text, stat } = await readBoundedRegularFile(path, bytes);
    return (stat.mode & 0o7777) === 0o755 && stat.uid === process.geteuid?.() && text === script;
  } catch {
    return false; // missing, a symlink, not a regular file, larger: written afresh
  }
}

/**
 * Ours only if the marker names this very file: the prototype (and any copy of it)
 * carries the marker too, with a placeholder for the name. Only regular files are read
 * (the caller checks): a FIFO would block.
 */
async function isOurShim(path: string, name: string): Promise<boolean> {
  const head = Buffer.alloc(200);
  const fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(() => undefined);
  if (fh === undefined) return false;
  try {
    const { bytesRead } = await fh.read(head, 0, head.length, 0);
    return head.subarray(0, bytesRead).toString('utf8').includes(`${SHIM_MARKER} ${name} (provider `);
  } finally {
    await fh.close();
  }
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
