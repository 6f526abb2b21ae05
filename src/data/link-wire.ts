import { z } from 'zod';
import { desiredStateSchema } from './desired-state.js';
import { rfc3339Schema, slotIdSchema, tokenIdSchema } from './renew-wire.js';

/**
 * The host link's wire contract (SPEC §8), shared by the host (`enroll`, later the link)
 * and the Gateway stand-ins (`dev/demo-gateway/host-control.ts`):
 *
 *   POST {gw}/v1/host/enroll      {"requestId", "code", "host": {"hostname", "version"}}
 *                                 200 {"hostId", "credential"} | 401 {"error": "code_invalid"}
 *   GET  {gw}/v1/host/state?after=<version>      (Bearer) 200 <desired state> | 204 | 401
 *   POST {gw}/v1/host/presence    (Bearer) {"hostId", "version", "stateVersion", "parts",
 *                                 "slots", "problems"}                      204 | 401
 *
 * As in renew-wire.ts: requests are parsed strictly (an unknown key is a client bug a test
 * should catch), answers tolerantly (a real Gateway may add fields; they are stripped). The
 * desired state itself is its own format (desired-state.ts).
 */

export const ENROLL_PATH = '/v1/host/enroll';
export const STATE_PATH = '/v1/host/state';
export const PRESENCE_PATH = '/v1/host/presence';

/** How long the Gateway may hold a state long poll (SPEC §8); a client waits a little longer. */
export const STATE_POLL_MAX_MS = 60_000;

/**
 * A one-time pairing code, typed or pasted by a person. Its format is the platform's, so
 * any visible ASCII is accepted; the bound keeps a pasted file from being sent.
 */
export const pairingCodeSchema = z
  .string()
  .min(4, 'the pairing code is too short')
  .max(256, 'the pairing code is too long')
  .regex(/^[\x21-\x7e]+$/, 'the pairing code must be visible ASCII without spaces');

/**
 * The host credential: a secret, stored in a file the link unit loads (`LoadCredential=`)
 * and sent as a Bearer token, so it must be a valid header value and a single line.
 */
export const hostCredentialSchema = z
  .string()
  .max(4096, 'the host credential is longer than 4 KiB')
  .regex(/^[\x21-\x7e]+$/, 'the host credential must be non-empty visible ASCII');

/**
 * Not a secret; it goes into presence bodies and into link.env (`AGENT_CONNECTORS_HOST_ID=`),
 * so an alphabet that needs no quoting in a systemd EnvironmentFile.
 */
export const hostIdSchema = z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/, 'hostId must match [A-Za-z0-9_.:-]{1,128}');

export const enrollRequestSchema = z.strictObject({
  requestId: z.uuid(),
  code: pairingCodeSchema,
  host: z.strictObject({
    hostname: z.string().min(1).max(253),
    version: z.string().min(1).max(64),
  }),
});

export type EnrollRequest = z.infer<typeof enrollRequestSchema>;

export const enrollOkSchema = z.object({
  hostId: hostIdSchema,
  credential: hostCredentialSchema,
});

export type EnrollOk = z.infer<typeof enrollOkSchema>;

/** Any error answer of the link endpoints: `{"error": "<code>"}`, extra fields stripped. */
export const linkErrorSchema = z.object({ error: z.string().min(1).max(128) });

export type LinkError = z.infer<typeof linkErrorSchema>;

/** The 200 body of `GET /v1/host/state`: the whole desired state. */
export const stateAnswerSchema = desiredStateSchema;

/** `?after=`: the version the host has; the Gateway answers only with a newer one. */
export const stateAfterSchema = z.coerce.number().int().min(0).max(Number.MAX_SAFE_INTEGER);

export const partHealthSchema = z.enum(['ok', 'degraded', 'down']);

export const presenceSchema = z.strictObject({
  hostId: hostIdSchema,
  /** The agent-connectors version running on the host. */
  version: z.string().min(1).max(64),
  /** The desired-state version apply has applied; null before the first. */
  stateVersion: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).nullable(),
  parts: z.record(z.string().regex(/^[a-z][a-z0-9-]{0,63}$/), partHealthSchema),
  slots: z
    .array(
      z.strictObject({
        slot: slotIdSchema,
        tokenId: tokenIdSchema.nullable(),
        expiresAt: rfc3339Schema.nullable(),
      }),
    )
    .max(20_000),
  /** doctor's problem codes: snake_case names, never a message with a value in it. */
  problems: z.array(z.string().regex(/^[a-z][a-z0-9_]{0,63}$/)).max(256),
});

export type Presence = z.infer<typeof presenceSchema>;

/** A link URL under a Gateway base URL; a base path, if any, is kept (as renewUrl does). */
export function linkUrl(gatewayUrl: string | URL, path: string, query?: Record<string, string>): URL {
  const base = new URL(gatewayUrl);
  const url = new URL(`${base.pathname.replace(/\/+$/, '')}${path}`, base);
  for (const [k, v] of Object.entries(query ?? {})) url.searchParams.set(k, v);
  return url;
}
