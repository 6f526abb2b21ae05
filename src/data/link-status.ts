import { join } from 'node:path';
import { z } from 'zod';
import { readBoundedText } from '../fs/bounded-read.js';
import { parseJsonWith } from './parse.js';
import { rfc3339Schema } from './renew-wire.js';

/**
 * `<handoff>/link-status.json`, written by the link (atomic, 0640) whenever its state poll
 * changes state or hears from the Gateway, read by `doctor` and `status`. The link is the
 * only process that knows whether the Gateway answers; nothing else on the host can see
 * its memory, and its journal is not something doctor should parse. No secret: error
 * details are a status code, a network error code or the validator's place-and-rule text.
 */

/** Stable codes of the last thing that went wrong with the state poll. */
export const linkErrorCodes = [
  /** The Gateway answered 401: the credential was refused; re-enrol. */
  'credential_rejected',
  /** The credential file is missing, unreadable or malformed. */
  'credential_unusable',
  'rate_limited',
  /** A 5xx. */
  'gateway_unavailable',
  /** Any other unexpected status. */
  'unexpected_status',
  /** Connection refused, reset, DNS, TLS, or no answer within the client timeout. */
  'network',
  /** A 200 whose body is not JSON, fails the schema or is too large. */
  'invalid_state',
] as const;

export const linkErrorCodeSchema = z.enum(linkErrorCodes);
export type LinkErrorCode = z.infer<typeof linkErrorCodeSchema>;

export const linkStateSchema = z.enum([
  /** The last poll was answered (200 or 204). */
  'polling',
  /** The last poll failed; the next one waits (jittered backoff, Retry-After). */
  'backing_off',
  /** A 401: nothing is sent until the credential file changes. */
  'halted',
  /** No usable credential to send. */
  'credential_unusable',
]);
export type LinkState = z.infer<typeof linkStateSchema>;

export const linkStatusSchema = z.strictObject({
  /** The link process, so a reader can tell a status left by a dead link. */
  pid: z.number().int().positive(),
  state: linkStateSchema,
  /** When the state last changed. */
  since: rfc3339Schema,
  /** When the file was written. */
  updatedAt: rfc3339Schema,
  /** The last time the Gateway answered a state poll (200 or 204): the host was in sync then. */
  lastSyncAt: rfc3339Schema.nullable(),
  /** The newest desired-state version handed over to apply by this process. */
  receivedVersion: z.number().int().min(0).nullable(),
  lastError: z
    .strictObject({
      code: linkErrorCodeSchema,
      detail: z.string().max(500),
      at: rfc3339Schema,
    })
    .nullable(),
});

export type LinkStatus = z.infer<typeof linkStatusSchema>;

export const LINK_STATUS_FILE = 'link-status.json';

/** The record is a few hundred bytes (its detail is capped at 500 characters). */
const MAX_LINK_STATUS_BYTES = 16 * 1024;

export function linkStatusPath(handoffRoot: string): string {
  return join(handoffRoot, LINK_STATUS_FILE);
}

export type LinkStatusRead = { kind: 'absent' } | { kind: 'invalid'; error: string } | { kind: 'ok'; status: LinkStatus };

export async function readLinkStatus(handoffRoot: string): Promise<LinkStatusRead> {
  // Written by the link, read by doctor and status as root: bounded, never a FIFO (fs/bounded-read.ts).
  const text = await readBoundedText(linkStatusPath(handoffRoot), MAX_LINK_STATUS_BYTES).catch(() => undefined);
  if (text === undefined) return { kind: 'absent' };
  const parsed = parseJsonWith(linkStatusSchema, text);
  return parsed.ok ? { kind: 'ok', status: parsed.value } : { kind: 'invalid', error: parsed.error };
}
