import { join } from 'node:path';
import { z } from 'zod';
import { readBoundedRegularFile } from '../fs/bounded-read.js';
import { hostRevokedSchema } from './host-revoked.js';
import { parseJsonWith } from './parse.js';
import { rfc3339Schema } from './renew-wire.js';

/**
 * `<handoff>/applied-state.json`, written by apply (the only writer of local state) after
 * each reconcile of `<handoff>/desired-state.json`, read by the link for presence and by
 * doctor: which desired-state version is in force, and whether the last one handed over
 * was rejected (validated as a whole; the last good one keeps serving). No secret.
 */
export const appliedStateSchema = z.strictObject({
  /** The version in force (0: none applied yet). */
  version: z.number().int().min(0),
  appliedAt: rfc3339Schema.nullable(),
  /** The newest version apply refused, and why (never a value from the file). */
  rejected: z.strictObject({ version: z.number().int().min(0).nullable(), error: z.string().max(1000), at: rfc3339Schema }).optional(),
  /**
   * The host-revoked marker (data/host-revoked.ts) apply acted on: the empty state is in
   * force (version 0, so a new enrolment's first state applies whatever its version).
   */
  hostRevoked: hostRevokedSchema.optional(),
});

export type AppliedState = z.infer<typeof appliedStateSchema>;

export const APPLIED_STATE_FILE = 'applied-state.json';
/** The file is a version, two dates and an error of at most 1000 characters. */
const MAX_APPLIED_STATE_BYTES = 16 * 1024;

export function appliedStatePath(handoffRoot: string): string {
  return join(handoffRoot, APPLIED_STATE_FILE);
}

/** The applied state, or undefined when none was written yet or the file is unusable. */
export async function readAppliedState(handoffRoot: string): Promise<AppliedState | undefined> {
  // In the hand-off root, which the link's group can write: bounded, no FIFO waited on.
  const text = await readBoundedRegularFile(appliedStatePath(handoffRoot), MAX_APPLIED_STATE_BYTES).then((f) => f.text, () => undefined);
  if (text === undefined) return undefined;
  const parsed = parseJsonWith(appliedStateSchema, text);
  return parsed.ok ? parsed.value : undefined;
}
