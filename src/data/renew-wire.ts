import { z } from 'zod';
import { MAX_TOKEN_BYTES } from '../token/token-file.js';

/**
 * The renewal wire contract of SPEC §4, shared by both sides: `renew fetch` (client) and
 * the Gateway stand-ins (`RenewAuthority` behind the dev demo Gateway and the test mock).
 *
 *   POST {gatewayUrl}/v1/host/credentials/{slot}/renew
 *   Authorization: Bearer <host renewal credential>
 *   {"requestId": "<uuid>", "expectedTokenId": "<tokenId applied now, or null>"}
 *
 * Requests are parsed strictly (an unknown key is a client bug we want a test to catch);
 * answers are parsed tolerantly (a real Gateway may add fields; they are stripped).
 */

/** A whole slot id. No `/`, no `%`, no whitespace: safe as a file name and a path segment. */
export const SLOT_ID = /^(?:instance|cli):[A-Za-z0-9_.-]{1,128}$/;

export const slotIdSchema = z
  .string()
  .regex(SLOT_ID, 'slot must be instance:<id> or cli:<provider>, id matching [A-Za-z0-9_.-]{1,128}');

export type SlotId = z.infer<typeof slotIdSchema>;

export type SlotKind = 'instance' | 'cli';

/** Splits a slot id into kind and id; undefined if it is not a valid slot id. */
export function parseSlotId(slot: string): { kind: SlotKind; id: string } | undefined {
  if (!SLOT_ID.test(slot)) return undefined;
  const colon = slot.indexOf(':');
  return { kind: slot.slice(0, colon) as SlotKind, id: slot.slice(colon + 1) };
}

/** The regex first: zod's parse for each of 11 000 slots cost apply ~150 ms per state; the error (a throw) is zod's. */
function slotOf(slot: string): string {
  return SLOT_ID.test(slot) ? slot : slotIdSchema.parse(slot);
}

export function instanceSlot(instanceId: string): string {
  return slotOf(`instance:${instanceId}`);
}

export function cliSlot(provider: string): string {
  return slotOf(`cli:${provider}`);
}

/**
 * A token id is not a secret (it goes into slot files and logs); a real Gateway's format
 * is unknown, so any visible ASCII up to 256 characters is accepted.
 */
export const tokenIdSchema = z.string().regex(/^[\x21-\x7e]{1,256}$/, 'tokenId must be 1-256 visible ASCII characters');

/**
 * The token is a secret and ends up in a token file that the forwarder parses with
 * `parseToken`: it must satisfy that parser (visible ASCII, at most 16 KiB), or it would
 * be applied and then refused on every request. The message never echoes the value.
 */
export const tokenSchema = z
  .string()
  .max(MAX_TOKEN_BYTES, 'token is longer than 16 KiB')
  .regex(/^[\x21-\x7e]+$/, 'token must be non-empty visible ASCII');

/** RFC 3339 date-time with `Z` or a numeric offset (never a local time), any precision. */
export const rfc3339Schema = z.iso.datetime({ offset: true });

export const renewRequestSchema = z.strictObject({
  requestId: z.uuid(),
  /** The tokenId applied now, or null when the slot has no token yet. Required, never omitted. */
  expectedTokenId: tokenIdSchema.nullable(),
});

export type RenewRequest = z.infer<typeof renewRequestSchema>;

export const renewOkSchema = z.object({
  slot: slotIdSchema,
  tokenId: tokenIdSchema,
  token: tokenSchema,
  expiresAt: rfc3339Schema,
  credentialGeneration: z.number().int().min(0),
});

export type RenewOk = z.infer<typeof renewOkSchema>;

/**
 * 409: the host's expectation is stale. `currentTokenId` is what the Gateway holds now;
 * fetch adopts it as its next `expectedTokenId`. Decision: it is null when the Gateway has
 * never minted for the slot (the host expected a token the Gateway does not have), so
 * adopting it verbatim (`expectedTokenId: null`) is always the right next request.
 */
export const renewConflictSchema = z.object({
  error: z.literal('token_conflict'),
  currentTokenId: tokenIdSchema.nullable(),
});

export type RenewConflict = z.infer<typeof renewConflictSchema>;

/** Any other error answer: `{"error": "<code>"}` (extra fields tolerated and stripped). */
export const renewErrorSchema = z.object({
  error: z.string().min(1),
});

export type RenewError = z.infer<typeof renewErrorSchema>;

export const RENEW_PATH_PREFIX = '/v1/host/credentials/';
export const RENEW_PATH_SUFFIX = '/renew';

/**
 * The request path for a slot. Decision: the slot is sent through `encodeURIComponent`,
 * so the colon goes out as `%3A` (`/v1/host/credentials/instance%3Aabc/renew`). RFC 3986
 * allows a raw `:` in a path segment and both forms decode to the same slot, but the
 * encoded form survives every URL parser and proxy unchanged; the slot alphabet leaves
 * nothing else to encode. Servers decode the segment and must accept both forms.
 */
export function renewPath(slot: string): string {
  return `${RENEW_PATH_PREFIX}${encodeURIComponent(slotIdSchema.parse(slot))}${RENEW_PATH_SUFFIX}`;
}

/** Full renewal URL under a Gateway base URL (a base path, if any, is kept). */
export function renewUrl(gatewayUrl: string | URL, slot: string): URL {
  const base = new URL(gatewayUrl);
  const prefix = base.pathname.replace(/\/+$/, '');
  return new URL(`${prefix}${renewPath(slot)}`, base);
}

export type RenewPathMatch = { ok: true; slot: string } | { ok: false };

/**
 * Server side: matches `/v1/host/credentials/{slot}/renew` on a raw pathname (no query).
 * undefined: not a renewal path at all (route elsewhere). `{ok: false}`: the renewal path
 * with a segment that is not a valid slot id (bad percent-encoding, `%2F`, bad alphabet).
 * Accepts the colon raw (`:`) or encoded (`%3A`, `%3a`).
 */
export function matchRenewPath(pathname: string): RenewPathMatch | undefined {
  if (!pathname.startsWith(RENEW_PATH_PREFIX) || !pathname.endsWith(RENEW_PATH_SUFFIX)) return undefined;
  const segment = pathname.slice(RENEW_PATH_PREFIX.length, pathname.length - RENEW_PATH_SUFFIX.length);
  if (segment.length === 0 || segment.includes('/')) return undefined;
  let slot: string;
  try {
    slot = decodeURIComponent(segment);
  } catch {
    return { ok: false };
  }
  return SLOT_ID.test(slot) ? { ok: true, slot } : { ok: false };
}
