import { z } from 'zod';
import { rfc3339Schema, slotIdSchema, tokenIdSchema } from '../../data/renew-wire.js';

/** A renewal in progress: its requestId, kept across every retry until it settles. */
export const pendingRenewalSchema = z.strictObject({ requestId: z.uuid(), expectedTokenId: tokenIdSchema.nullable(), since: rfc3339Schema });

/**
 * The link's private memory of one slot (no secret: ids and times only):
 * - `pending`: the renewal in progress. Durable BEFORE the request is sent, so a crash or
 *   a lost answer is retried with the same requestId and the Gateway answers with the
 *   token it already minted instead of minting a second one.
 * - `delivered`: the last token handed to apply (id and times), so the link does not renew
 *   again while apply has not caught up.
 * - `adopted`: the Gateway's current tokenId learned from a 409, the next expectation.
 */
export const renewalSlotStateSchema = z.strictObject({
  slot: slotIdSchema,
  pending: pendingRenewalSchema.optional(),
  delivered: z
    .strictObject({ tokenId: tokenIdSchema, expiresAt: rfc3339Schema, generation: z.number().int().min(0), receivedAt: rfc3339Schema })
    .optional(),
  adopted: tokenIdSchema.nullable().optional(),
});

export type RenewalSlotState = z.infer<typeof renewalSlotStateSchema>;

/** A ledger line saying the slot's record is gone (the slot retired). */
export const forgottenSchema = z.strictObject({ slot: slotIdSchema, forgotten: z.literal(true) });
