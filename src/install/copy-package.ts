import { readFile, readlink, realpath } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { NOT_SHIPPED, PACKAGE_PARTS } from '../data/package-parts.js';
import { devOnlyFolders, PACKAGE_LOCK, parsePackageLock } from '../data/package-lock.js';
import { ConfigError } from '../errors.js';
import { copyTree, type EntryKind, type KeepEntry } from '../fs/copy-tree.js';

/**
 * What `install` copies into the package directory: the package tree's parts, less what is
 * not shipped, and from a checkout only the node_modules production needs. A checkout's
 * node_modules holds the dev tools too (TypeScript, tap, the MCP SDK: six times the
 * production packages), which no unit loads and whose copy was most of install's time.
 * Planned first (`planPackageCopy` reads the lockfile), so an invalid lockfile stops install
 * before anything is removed or written.
 */
export interface PackageCopy {
  /** The package tree copied. */
  from: string;
  /** A node_modules copied instead of the tree's own, whole (the .deb build's production-only one). */
  nodeModules?: string;
  /** Folders relative to the tree (`node_modules/…`) of the packages only development needs. */
  devOnly: ReadonlySet<string>;
}

/**
 * The tree's own node_modules is trimmed when the tree has a package-lock.json (a checkout:
 * npm never publishes one, so an npm tarball or an installed package has none and is copied
 * whole, as it is already what production needs). An invalid lockfile is a ConfigError
 * naming it: copying everything instead would silently put the dev tools back.
 */
export async function planPackageCopy(from: string, nodeModules?: string): Promise<PackageCopy> {
  const devOnly = nodeModules === undefined ? await readDevOnly(join(from, PACKAGE_LOCK)) : new Set<string>();
  return { from, nodeModules, devOnly };
}

async function readDevOnly(file: string): Promise<Set<string>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return new Set();
    throw err;
  }
  const lock = parsePackageLock(text);
  if (!lock.ok) {
    throw new ConfigError(
      `${file} is invalid (${lock.error}): install reads it to leave node_modules' dev-only packages out; ` +
        `restore it (git checkout ${PACKAGE_LOCK}) and run npm ci, then install again`,
    );
  }
  return devOnlyFolders(lock.value);
}

/** Copies every part into `dest` (which exists and is empty). */
export async function copyPackage(copy: PackageCopy, dest: string): Promise<void> {
  const skipped = new Set<string>([...NOT_SHIPPED, ...copy.devOnly]);
  for (const part of PACKAGE_PARTS) {
    const named = part === 'node_modules' && copy.nodeModules ? copy.nodeModules : join(copy.from, part);
    // A part that is a link (a checkout whose node_modules links to another checkout's) is
    // copied as the tree it names: the installed package must not lean on the checkout.
    const src = await realpath(named).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return undefined;
      throw err;
    });
    if (src !== undefined) await copyTree(src, join(dest, part), keepEntry(part, src, skipped, copy.devOnly));
  }
}

/**
 * What of one part is copied, asked for every file and folder: a Set lookup of its path
 * relative to the tree. A folder left out is not entered, so the folder itself is all that
 * needs to match. Only a link in a `.bin` folder costs a readlink.
 */
function keepEntry(part: string, src: string, skipped: ReadonlySet<string>, devOnly: ReadonlySet<string>): KeepEntry {
  return (rel: string, kind: EntryKind) => {
    const path = `${part}/${rel}`;
    if (skipped.has(path)) return false;
    return kind === 'link' && devOnly.size > 0 && inBinFolder(path) ? binLinkKept(join(src, rel), path, devOnly) : true;
  };
}

const BIN = 'node_modules/.bin';

/** `…node_modules/.bin/<name>`: npm's links to the packages' executables. */
function inBinFolder(rel: string): boolean {
  const at = rel.lastIndexOf('/') - BIN.length;
  return at >= 0 && rel.startsWith(BIN, at) && (at === 0 || rel[at - 1] === '/');
}

/**
 * A `.bin` link into a package left out would dangle in the copy: it is left out too. npm
 * writes these links relative to their folder; an absolute one is copied as it is.
 */
async function binLinkKept(path: string, rel: string, devOnly: ReadonlySet<string>): Promise<boolean> {
  const target = await readlink(path);
  if (posix.isAbsolute(target)) return true;
  return !withinAny(posix.join(posix.dirname(rel), target), devOnly);
}

/** Whether `rel` is one of `folders` or inside one. */
function withinAny(rel: string, folders: ReadonlySet<string>): boolean {
  for (let at = rel.indexOf('/'); at !== -1; at = rel.indexOf('/', at + 1)) {
    if (folders.has(rel.slice(0, at))) return true;
  }
  return folders.has(rel);
}
