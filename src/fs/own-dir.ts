import { lstatSync, mkdirSync, type Stats } from 'node:fs';

/** A directory refused by `verifyOwnDir`: a symlink, not a directory, or someone else's. */
export class UnsafeDirError extends Error {
  constructor(
    readonly path: string,
    readonly reason: 'symlink' | 'not-directory' | 'owner',
  ) {
    super(
      reason === 'symlink'
        ? `${path} is a symlink (not followed)`
        : reason === 'not-directory'
          ? `${path} is not a directory`
          : `${path} is not owned by a trusted user`,
    );
    this.name = 'UnsafeDirError';
  }
}

/**
 * Checks, by lstat, that `path` is a real directory (not a symlink to one) owned by one of
 * `owners`. A directory another process can replace (the hand-off's group may rename
 * entries of a 2770 directory) is checked before each use, not once.
 */
export async function verifyOwnDir(path: string, owners: ReadonlySet<number>): Promise<Stats> {
  return verifiedStat(path, lstatSync(path), owners);
}

function verifiedStat(path: string, st: Stats, owners: ReadonlySet<number>): Stats {
  if (st.isSymbolicLink()) throw new UnsafeDirError(path, 'symlink');
  if (!st.isDirectory()) throw new UnsafeDirError(path, 'not-directory');
  if (!owners.has(st.uid)) throw new UnsafeDirError(path, 'owner');
  return st;
}

/**
 * Creates `path` (the last component only: its parent is verified by the caller) unless
 * it exists, then verifies it as `verifyOwnDir` does. mkdir never follows a symlink at
 * the last component, so a planted link is found by the check, not written through.
 */
export async function ensureOwnDir(path: string, owners: ReadonlySet<number>, mode: number): Promise<Stats> {
  // Synchronous calls, and mkdir only when lstat found nothing: apply checks slots/ before
  // each slot file it writes, and an awaited mkdir failing with EEXIST then an awaited lstat
  // cost more than the rest of a renewal's slot-file write.
  const st = lstatSync(path, { throwIfNoEntry: false });
  if (st) return verifiedStat(path, st, owners);
  try {
    mkdirSync(path, { mode });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  return verifiedStat(path, lstatSync(path), owners);
}
