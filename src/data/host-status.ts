import { z } from 'zod';
import { linkErrorCodeSchema, linkStateSchema } from './link-status.js';
import { rfc3339Schema, slotIdSchema, tokenIdSchema } from './renew-wire.js';

/**
 * `agent-connectors status --json`: a short summary of the host for a person or a
 * dashboard (doctor is the checker; status only reports). Field names are stable; an
 * optional field is omitted when its value is unknown, never filled with a guess. No
 * secret: slots carry their token id and expiry, never a token.
 */

export const HOST_STATUS_FORMAT = 'agent-connectors.status/1';

/** up: answers (or its unit is active); degraded: answers, not ok; down: no answer / unit not active; unknown: nothing to ask. */
export const partStateSchema = z.enum(['up', 'degraded', 'down', 'unknown']);
export type PartState = z.infer<typeof partStateSchema>;

const partSchema = z.strictObject({
  state: partStateSchema,
  /** Where the answer came from. */
  via: z.enum(['healthz', 'systemd', 'link-status', 'none']),
});

export const hostStatusSchema = z.strictObject({
  format: z.literal(HOST_STATUS_FORMAT),
  version: z.string(),
  generatedAt: rfc3339Schema,
  parts: z.strictObject({ forwarder: partSchema, 'cli-proxy': partSchema, link: partSchema, apply: partSchema }),
  enrolment: z.strictObject({ enrolled: z.boolean(), gatewayUrl: z.string().optional(), hostId: z.string().optional() }),
  /** The link's own record (link-status.json); absent on a host never enrolled or before the link first wrote it. */
  link: z
    .strictObject({
      state: linkStateSchema,
      since: rfc3339Schema,
      running: z.boolean(),
      lastSyncAt: rfc3339Schema.nullable(),
      lastError: z.strictObject({ code: linkErrorCodeSchema, at: rfc3339Schema }).nullable(),
    })
    .optional(),
  state: z.strictObject({
    /** The desired-state version in force (apply's record); null: none. */
    applied: z.number().int().min(0).nullable(),
    appliedAt: rfc3339Schema.nullable(),
    /** The version in `<handoff>/desired-state.json`; null: none, or unreadable. */
    received: z.number().int().min(0).nullable(),
    rejected: z.strictObject({ version: z.number().int().min(0).nullable(), at: rfc3339Schema, error: z.string() }).optional(),
  }),
  slots: z.array(
    z.strictObject({
      slot: slotIdSchema,
      tokenId: tokenIdSchema.nullable(),
      expiresAt: rfc3339Schema.nullable(),
      /** Seconds until expiresAt (negative: expired); null: never received a token. */
      expiresInS: z.number().int().nullable(),
      revoked: z.boolean(),
    }),
  ),
  /** When the audit spool last handed events to the Gateway. Omitted while unknown. */
  lastAuditUpload: rfc3339Schema.optional(),
  /** native_cli audit events waiting in the spool, and how many a full spool has dropped. */
  audit: z.strictObject({ spooled: z.number().int().min(0), dropped: z.number().int().min(0) }).optional(),
});

export type HostStatus = z.infer<typeof hostStatusSchema>;
