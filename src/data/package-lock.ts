import { z } from 'zod';
import { parseJsonWith, type ParseResult } from './parse.js';

/**
 * npm's package-lock.json, as far as `install` reads it: which packages of a checkout's
 * node_modules only its development needs. Versions 2 and 3 (npm ≥ 7) describe the tree in
 * `packages`, keyed by each package's folder (`node_modules/a`, `node_modules/a/node_modules/b`);
 * version 1 has no such map and is not read.
 */
export const PACKAGE_LOCK = 'package-lock.json';

/**
 * npm's flags (docs/content/configuring-npm/package-lock-json.md): `dev` marks a package
 * only the devDependencies tree needs; `optional`, one only optionalDependencies need;
 * `devOptional`, one that is a dev dependency *and* an optional dependency of a production
 * one. Only `dev` is read: a `devOptional` package is loaded by production code wherever
 * it is installed, so it ships, exactly as `npm ci --omit=dev` keeps it (npm omits it
 * only when dev and optional are both omitted); an `optional` one ships when it is there.
 * Other fields, and unknown ones, are left alone, so a newer npm's additions do not
 * make the file invalid.
 */
const lockEntry = z.object({ dev: z.boolean().optional() });

const packageLockSchema = z.object({
  lockfileVersion: z.union([z.literal(2), z.literal(3)]),
  packages: z.record(z.string(), lockEntry),
});
export type PackageLock = z.infer<typeof packageLockSchema>;

/** The file's text → its packages, or an error that never quotes the text. */
export function parsePackageLock(text: string): ParseResult<PackageLock> {
  // Package folders are names, not secrets: issue paths show them whole.
  return parseJsonWith(packageLockSchema, text, []);
}

/**
 * The folders (relative to the package tree, `node_modules/…`) of the packages only
 * development needs. A nested one under a production package is listed on its own; one
 * under a dev package is listed too, though copying already stops at its parent.
 * Keys outside node_modules (the root "", workspace folders) are never node_modules' to skip.
 */
export function devOnlyFolders(lock: PackageLock): Set<string> {
  const out = new Set<string>();
  for (const [folder, entry] of Object.entries(lock.packages)) {
    if (entry.dev === true && folder.startsWith('node_modules/')) out.add(folder);
  }
  return out;
}
