import { createHash } from 'node:crypto';

/**
 * The host credential gate shared by every client that holds it (renewal fetch, the link's
 * state poller and presence): after a 401, nothing is sent with that credential again; a
 * changed credential (re-enrolment) resumes. Only a digest of the refused one is kept.
 */

/** What the halt remembers: a digest, so the refused credential itself is not kept around. */
export function credentialDigest(credential: string): string {
  return createHash('sha256').update(credential).digest('hex');
}

export type CredentialGate = 'run' | 'halted' | 'resume';

/**
 * Whether requests may go out with the credential read now: not while it is still the one
 * the Gateway refused; a changed credential resumes them.
 */
export function credentialGate(haltedOn: string | undefined, digest: string): CredentialGate {
  if (haltedOn === undefined) return 'run';
  return haltedOn === digest ? 'halted' : 'resume';
}
