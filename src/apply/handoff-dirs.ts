import { mkdirSync, statSync } from 'node:fs';
import { HANDOFF_ROOT_MODE, type HandoffPaths } from '../data/handoff.js';
import { ensureOwnDir } from '../fs/own-dir.js';

/**
 * The hand-off is shared with the link (its group may create entries in the root), and
 * the link is assumed hostile: every directory apply writes into or moves files into is
 * apply's own, checked right before use. A `rejected` that is a symlink to the shim
 * directory would otherwise have apply move a file the link wrote into the agents' PATH.
 * The root is sticky (HANDOFF_ROOT_MODE), so the link cannot rename apply's directories
 * away once they are checked; the check still refuses what a link planted before apply
 * made them, or a root an operator made without the sticky bit.
 *
 * Trusted owners: the hand-off root's owner (install's choice; the link cannot replace
 * the root, its parent is not the link's), the UID apply runs as, and root. The link's
 * UID is none of them, so a directory it made in place of apply's is refused too.
 */
export async function handoffOwners(root: string): Promise<ReadonlySet<number>> {
  // stat, not lstat: an operator may point the hand-off root elsewhere by a symlink.
  const st = statSync(root);
  return new Set([st.uid, process.geteuid?.() ?? st.uid, 0]);
}

/** Modes of apply's own sub-directories: inbox/ the link writes, slots/ it reads, rejected/ it needs not. */
const MODES = { inbox: 0o770, slots: 0o770, rejected: 0o750 } as const;

export type HandoffDir = keyof typeof MODES;

/** Creates the directory if missing and checks it is apply's (see `verifyOwnDir`); throws UnsafeDirError otherwise. */
export async function ensureHandoffDir(paths: HandoffPaths, which: HandoffDir): Promise<void> {
  // The root is install's (or made here on a host never installed: `bind` in a fresh state
  // dir), sticky as install makes it (mkdir keeps the sticky bit, not the setgid one).
  // Synchronous calls: this runs before every slot file apply writes (see ensureOwnDir).
  mkdirSync(paths.root, { recursive: true, mode: HANDOFF_ROOT_MODE & 0o1777 });
  await ensureOwnDir(paths[which], await handoffOwners(paths.root), MODES[which]);
}
