import { lstat } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { atomicWrite } from '../fs/atomic-write.js';
import { readBoundedRegularFile } from '../fs/bounded-read.js';
import { deleteFile } from '../fs/delete-file.js';
import { DESIRED_STATE_FILE } from './desired-state.js';
import { parseJsonWith } from './parse.js';
import { rfc3339Schema } from './renew-wire.js';

/**
 * `<handoff>/host-revoked.json`: access ended for the whole host (seed §4.4, §8). The link
 * writes it when the Gateway answers its credential with 401 (the host was removed in the
 * platform); `unenroll` (root) writes it too, whether the link runs or not. apply, the only
 * writer of state, reads it and applies the empty state: every token file and shim
 * deleted, registry and catalog emptied, every slot retired. It stays until `enroll`
 * stores a new credential, so the host serves nothing in between. No secret.
 */
export const HOST_REVOKED_FILE = 'host-revoked.json';

export const hostRevokedSchema = z.strictObject({
  at: rfc3339Schema,
  /** `gateway`: a 401 to the host credential; `unenroll`: the operator; `unknown`: a file apply could not read. */
  by: z.enum(['gateway', 'unenroll', 'unknown']),
});
export type HostRevoked = z.infer<typeof hostRevokedSchema>;

const MAX_MARKER_BYTES = 4 * 1024;

export function hostRevokedPath(handoffRoot: string): string {
  return join(handoffRoot, HOST_REVOKED_FILE);
}

/**
 * The marker, or undefined when there is none. Anything at its name that is not a valid
 * marker (a symlink, a FIFO, garbage) still means revoked: the link may write it, and a
 * link that could write garbage could as well write a valid one, so failing closed costs
 * nothing. Such an entry is told apart by its mtime.
 */
export async function readHostRevoked(handoffRoot: string): Promise<HostRevoked | undefined> {
  const path = hostRevokedPath(handoffRoot);
  const st = await lstat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  if (!st) return undefined;
  const text = await readBoundedRegularFile(path, MAX_MARKER_BYTES).then((f) => f.text, () => undefined);
  const parsed = text === undefined ? undefined : parseJsonWith(hostRevokedSchema, text);
  return parsed?.ok ? parsed.value : { at: new Date(Math.floor(st.mtimeMs)).toISOString(), by: 'unknown' };
}

/**
 * Hands the revocation to apply: the marker (kept if one is there, so a restarted link
 * does not revoke again), then the desired state of the revoked enrolment removed, so
 * nothing would bring it back and the next enrolment's link polls from version 0.
 * Returns whether a new marker was written.
 */
export async function writeHostRevoked(handoffRoot: string, by: HostRevoked['by'], now: number = Date.now()): Promise<boolean> {
  const path = hostRevokedPath(handoffRoot);
  const exists = await lstat(path).then(() => true, () => false);
  if (!exists) await atomicWrite(path, `${JSON.stringify({ at: new Date(now).toISOString(), by })}\n`, { mode: 0o640 });
  await deleteFile(join(handoffRoot, DESIRED_STATE_FILE));
  return !exists;
}

/** `enroll`: a new credential ends the revocation; a desired state left from the old enrolment goes too. Returns whether there was one. */
export async function clearHostRevoked(handoffRoot: string): Promise<boolean> {
  const had = await deleteFile(hostRevokedPath(handoffRoot));
  if (had) await deleteFile(join(handoffRoot, DESIRED_STATE_FILE));
  return had;
}
