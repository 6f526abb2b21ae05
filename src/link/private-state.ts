import { lstat, rename } from 'node:fs/promises';
import { join } from 'node:path';
import type { StateLayout } from '../data/state-layout.js';

/** 0.1.0 kept the link's private state (renewal's requestIds in flight) under this name. */
export const OLD_PRIVATE_DIR = 'renew-fetch';

/**
 * Moves 0.1.0's `<state>/renew-fetch` to `<state>/link` when only the old one exists, so a
 * renewal in flight across an upgrade keeps its requestId (a new one would mint a second
 * token the Gateway then honours instead). Every install gets this, .deb or not, because
 * the link runs it at start. Returns the old path when it moved it.
 */
export async function adoptOldPrivateState(layout: Pick<StateLayout, 'root' | 'linkPrivate'>): Promise<string | undefined> {
  const old = join(layout.root, OLD_PRIVATE_DIR);
  if (!(await present(old)) || (await present(layout.linkPrivate))) return undefined;
  // rename(2) would also replace an empty directory at the new path: checked above, so a
  // directory the link made after the check is the only race, and the link is one process.
  await rename(old, layout.linkPrivate);
  return old;
}

async function present(path: string): Promise<boolean> {
  return lstat(path).then(
    () => true,
    (err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return false;
      throw err;
    },
  );
}
