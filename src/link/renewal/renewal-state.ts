import { mkdir, readdir, readFile, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { atomicWrite, atomicWriteSync } from '../../fs/atomic-write.js';
import { parseJsonWith } from '../../data/parse.js';
import { rfc3339Schema, slotIdSchema, tokenIdSchema } from '../../data/renew-wire.js';

/**
 * fetch's private, durable memory (in its own StateDirectory, unreadable to anyone else),
 * one file per slot so each update is one atomic rename:
 * - `pending`: the renewal in progress. Written BEFORE the request is sent, so a crash or
 *   a lost answer is retried with the same requestId and the Gateway answers with the
 *   token it already minted instead of minting a second one.
 * - `delivered`: the last token handed to apply (no secret: id and times only), so fetch
 *   does not renew again while apply has not caught up.
 * - `adopted`: the Gateway's current tokenId learned from a 409, the next expectation.
 */
export const renewalSlotStateSchema = z.strictObject({
  slot: slotIdSchema,
  pending: z
    .strictObject({ requestId: z.uuid(), expectedTokenId: tokenIdSchema.nullable(), since: rfc3339Schema })
    .optional(),
  delivered: z
    .strictObject({ tokenId: tokenIdSchema, expiresAt: rfc3339Schema, generation: z.number().int().min(0), receivedAt: rfc3339Schema })
    .optional(),
  adopted: tokenIdSchema.nullable().optional(),
});

export type RenewalSlotState = z.infer<typeof renewalSlotStateSchema>;

export class RenewalState {
  /**
   * fetch is the only writer of these files and one process runs: what it wrote or read
   * once is kept, so a scan of 10 000 slots reads none of them again.
   */
  private readonly cache = new Map<string, RenewalSlotState>();

  constructor(readonly dir: string) {}

  private path(slot: string): string {
    return join(this.dir, `${slot}.json`);
  }

  async init(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  /** A missing or unreadable record starts afresh: worst case one extra renewal, never a wrong token. */
  async read(slot: string): Promise<RenewalSlotState> {
    const cached = this.cache.get(slot);
    if (cached) return cached;
    const text = await readFile(this.path(slot), 'utf8').catch(() => undefined);
    const parsed = text === undefined ? undefined : parseJsonWith(renewalSlotStateSchema, text);
    const state = parsed?.ok && parsed.value.slot === slot ? parsed.value : { slot };
    this.cache.set(slot, state);
    return state;
  }

  /** The slot was retired: its record goes with it. */
  async forget(slot: string): Promise<void> {
    this.cache.delete(slot);
    await unlink(this.path(slot)).catch(() => undefined);
  }

  /** The slots with a record on disk. */
  async recorded(): Promise<string[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    return names.flatMap((n) => (n.endsWith('.json') && !n.startsWith('.') && slotIdSchema.safeParse(n.slice(0, -5)).success ? [n.slice(0, -5)] : []));
  }

  /**
   * `durable: false` skips the fsyncs (still whole or absent across a crash of the process):
   * for a record whose loss after a power cut is harmless. The delivered record is one: lost,
   * the pending requestId is still on disk, its retry is answered with the token already
   * minted, and apply ignores a token it already applied.
   */
  async write(state: RenewalSlotState, options: { durable?: boolean } = {}): Promise<void> {
    const text = `${JSON.stringify(state)}\n`;
    if (options.durable === false) atomicWriteSync(this.path(state.slot), text, { mode: 0o600 });
    else await atomicWrite(this.path(state.slot), text, { mode: 0o600 });
    this.cache.set(state.slot, state);
  }
}
