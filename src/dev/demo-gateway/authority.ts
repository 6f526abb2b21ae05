import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { slotIdSchema, type RenewConflict, type RenewError, type RenewOk, type RenewRequest } from '../../data/renew-wire.js';

/**
 * The Gateway's side of renewal (SPEC §4) as a small synchronous state machine, used by
 * the dev demo Gateway and wrapped by the test mock. Not our production Gateway, but
 * faithful: real idempotency, real compare-and-set, tokens that expire.
 *
 * Order of checks in `renew`, and why:
 *   1. credential  → 401 host_credential_invalid. First, so nothing (not even a stored
 *      answer with its token) is ever given to a caller without the credential.
 *   2. slot        → 404 slot_not_found, for unknown and revoked slots, replays included:
 *      a token of a revoked slot is useless, and the host should learn of the revocation.
 *   3. requestId   → a requestId already committed for this slot gets the same stored
 *      200 answer, byte for byte, whatever `expectedTokenId` says now (idempotent retry).
 *   4. CAS         → `expectedTokenId` ≠ the current tokenId (null matches only a slot that
 *      has never had a token) → 409 token_conflict with `currentTokenId`. A 409 is not a
 *      commit: it is NOT stored against the requestId, so the same requestId may still
 *      commit later (fetch uses a new requestId after adopting; either is safe).
 *   5. mint        → new random tokenId and token, expiresAt = now + lifetime,
 *      generation + 1; the 200 answer is stored under (slot, requestId) and counted.
 *
 * Idempotency records are keyed by (slot, requestId): a requestId reused for another slot
 * is a different renewal. Records are kept for the authority's lifetime (a real Gateway
 * would keep them at least as long as a token lives).
 *
 * A slot honours only its current token (SPEC §4, seed §8: "the old short-lived token
 * stops working as soon as the new one takes effect"): a mint revokes the slot's previous
 * token at once. This is the rule the host must survive, so it is the default; the
 * lenient rule (old tokens valid until their own expiresAt) exists for a test that says
 * why it needs it. Revoking a slot invalidates all its tokens at once. Rotating the host
 * credential does not touch tokens.
 *
 * Secrets: tokens and the credential live only in `#private` fields (not serialised by
 * JSON.stringify, not shown by util.inspect) and leave only in the 200 body of `renew`.
 */

export interface RenewAuthorityOptions {
  /** The host renewal credential the Gateway accepts, or a validator for one. */
  credential: string | CredentialValidator;
  /** Lifetime of each minted token, ms. */
  tokenLifetimeMs: number;
  /** Clock, ms since the epoch. Default Date.now. */
  now?: () => number;
  /** Unknown (never revoked) slots are created on first renewal. Default false: 404. */
  autoCreateSlots?: boolean;
  /** Slots that exist from the start. */
  slots?: readonly string[];
  /** Prefix of minted tokens (visible ASCII). Default `gw_`. */
  tokenPrefix?: string;
  /**
   * `current` (default): a mint revokes the slot's previous token at once, as the real
   * Gateway does. `until-expiry`: old tokens stay valid until they expire (lenient).
   */
  tokenValidity?: 'current' | 'until-expiry';
}

export type CredentialValidator = (bearer: string) => boolean;

export type RenewBody = RenewOk | RenewConflict | RenewError;

export interface RenewResult {
  status: number;
  body: RenewBody;
  headers?: Record<string, string>;
}

/** Non-secret view of a slot. */
export interface SlotState {
  slot: string;
  tokenId: string | null;
  expiresAt: string | null;
  generation: number;
  revoked: boolean;
}

export interface RenewStats {
  /** Tokens minted by `renew` (a commit). Out-of-band mints are in `mintedElsewhere`. */
  minted: number;
  /** Every call of `renew`, whatever its answer. */
  renewCalls: number;
  /** Repeated requestIds answered from the store. */
  replays: number;
  /** 409 answers. */
  conflicts: number;
  unauthorized: number;
  notFound: number;
  /** Tokens minted by `mintElsewhere` (another host renewed the slot). */
  mintedElsewhere: number;
  /** Tokens minted by `renew`, per slot. */
  perSlotMinted: Record<string, number>;
}

export interface ValidToken {
  slot: string;
  tokenId: string;
  generation: number;
}

interface SlotRecord {
  tokenId: string | null;
  expiresAtMs: number | null;
  generation: number;
  revoked: boolean;
}

interface TokenRecord {
  slot: string;
  tokenId: string;
  generation: number;
  expiresAtMs: number;
}

export class RenewAuthority {
  readonly tokenLifetimeMs: number;
  readonly #now: () => number;
  readonly #autoCreate: boolean;
  readonly #tokenPrefix: string;
  readonly #strict: boolean;
  #validate: CredentialValidator;
  readonly #slots = new Map<string, SlotRecord>();
  /** `${slot}\n${requestId}` → the committed 200 answer (frozen). */
  readonly #answers = new Map<string, Readonly<RenewOk>>();
  /** requestId → number of tokens minted for it (across slots). */
  readonly #mintedFor = new Map<string, number>();
  /** token → record. */
  readonly #tokens = new Map<string, TokenRecord>();
  readonly #stats = {
    minted: 0,
    renewCalls: 0,
    replays: 0,
    conflicts: 0,
    unauthorized: 0,
    notFound: 0,
    mintedElsewhere: 0,
  };
  readonly #perSlotMinted = new Map<string, number>();

  constructor(options: RenewAuthorityOptions) {
    if (!Number.isFinite(options.tokenLifetimeMs) || options.tokenLifetimeMs <= 0) {
      throw new RangeError('tokenLifetimeMs must be a positive number');
    }
    this.tokenLifetimeMs = options.tokenLifetimeMs;
    this.#now = options.now ?? Date.now;
    this.#autoCreate = options.autoCreateSlots ?? false;
    this.#tokenPrefix = options.tokenPrefix ?? 'gw_';
    this.#strict = (options.tokenValidity ?? 'current') === 'current';
    if (!/^[\x21-\x7e]*$/.test(this.#tokenPrefix)) throw new RangeError('tokenPrefix must be visible ASCII');
    this.#validate = toValidator(options.credential);
    for (const slot of options.slots ?? []) this.createSlot(slot);
  }

  /** Replaces the accepted credential (rotation). Tokens already minted stay valid. */
  setCredential(credential: string | CredentialValidator): void {
    this.#validate = toValidator(credential);
  }

  /** From now on every credential is refused (401). */
  invalidateCredential(): void {
    this.#validate = () => false;
  }

  /**
   * Creates a slot with no token (tokenId null). An existing live slot is left alone. A
   * revoked slot comes back with no token; its generation keeps counting up, so an apply
   * side comparing generations never sees one go backwards.
   */
  createSlot(slot: string): void {
    slotIdSchema.parse(slot);
    const existing = this.#slots.get(slot);
    if (existing && !existing.revoked) return;
    this.#slots.set(slot, { tokenId: null, expiresAtMs: null, generation: existing?.generation ?? 0, revoked: false });
  }

  /** Revokes a slot: renewals answer 404 and all its tokens stop being valid at once. */
  revokeSlot(slot: string): void {
    const rec = this.#slots.get(slot);
    if (rec) rec.revoked = true;
    else if (slotIdSchema.safeParse(slot).success) {
      this.#slots.set(slot, { tokenId: null, expiresAtMs: null, generation: 0, revoked: true });
    }
    for (const [token, t] of this.#tokens) if (t.slot === slot) this.#tokens.delete(token);
  }

  slotState(slot: string): SlotState | undefined {
    const rec = this.#slots.get(slot);
    if (!rec) return undefined;
    return {
      slot,
      tokenId: rec.tokenId,
      expiresAt: rec.expiresAtMs === null ? null : new Date(rec.expiresAtMs).toISOString(),
      generation: rec.generation,
      revoked: rec.revoked,
    };
  }

  slotIds(): string[] {
    return [...this.#slots.keys()];
  }

  /**
   * One renewal. `bearer` is the credential from `Authorization: Bearer …` (undefined if
   * absent); `body` is an already validated request body. Synchronous: concurrent
   * requests are serialised by the event loop, so CAS needs no lock.
   */
  renew(slot: string, bearer: string | undefined, body: RenewRequest): RenewResult {
    this.#stats.renewCalls += 1;
    if (bearer === undefined || !this.#validate(bearer)) {
      this.#stats.unauthorized += 1;
      return error(401, 'host_credential_invalid');
    }
    let rec = this.#slots.get(slot);
    if (!rec && this.#autoCreate && slotIdSchema.safeParse(slot).success) {
      this.createSlot(slot);
      rec = this.#slots.get(slot);
    }
    if (!rec || rec.revoked) {
      this.#stats.notFound += 1;
      return error(404, 'slot_not_found');
    }
    const key = `${slot}\n${body.requestId}`;
    const stored = this.#answers.get(key);
    if (stored) {
      this.#stats.replays += 1;
      return ok(stored);
    }
    if (body.expectedTokenId !== rec.tokenId) {
      this.#stats.conflicts += 1;
      const conflict: RenewConflict = { error: 'token_conflict', currentTokenId: rec.tokenId };
      return { status: 409, body: conflict, headers: { 'cache-control': 'no-store' } };
    }
    const answer = Object.freeze(this.#mint(slot, rec));
    this.#answers.set(key, answer);
    this.#mintedFor.set(body.requestId, (this.#mintedFor.get(body.requestId) ?? 0) + 1);
    this.#stats.minted += 1;
    this.#perSlotMinted.set(slot, (this.#perSlotMinted.get(slot) ?? 0) + 1);
    return ok(answer);
  }

  /**
   * Mints out of band, as if another host (or the cloud console) had renewed the slot:
   * a host still expecting the previous tokenId now gets a 409. Returns the new tokenId
   * and generation, never the token. Throws on an unknown or revoked slot.
   */
  mintElsewhere(slot: string): { tokenId: string; generation: number } {
    const rec = this.#slots.get(slot);
    if (!rec || rec.revoked) throw new Error('mintElsewhere: no such live slot');
    const answer = this.#mint(slot, rec);
    this.#stats.mintedElsewhere += 1;
    return { tokenId: answer.tokenId, generation: answer.credentialGeneration };
  }

  /** The slot and tokenId a token belongs to, if it is valid now (not expired, slot live). */
  isValidToken(token: string): ValidToken | undefined {
    const rec = this.#tokens.get(token);
    if (!rec) return undefined;
    if (this.#now() >= rec.expiresAtMs) return undefined;
    const slot = this.#slots.get(rec.slot);
    if (!slot || slot.revoked) return undefined;
    return { slot: rec.slot, tokenId: rec.tokenId, generation: rec.generation };
  }

  /** How many tokens `renew` minted for this requestId (0 or 1 unless idempotency broke). */
  mintedForRequest(requestId: string): number {
    return this.#mintedFor.get(requestId) ?? 0;
  }

  stats(): RenewStats {
    return { ...this.#stats, perSlotMinted: Object.fromEntries(this.#perSlotMinted) };
  }

  /** Serialising the authority (e.g. by a logger) shows counters, never a secret. */
  toJSON(): RenewStats {
    return this.stats();
  }

  #mint(slot: string, rec: SlotRecord): RenewOk {
    const now = this.#now();
    const token = `${this.#tokenPrefix}${randomBytes(32).toString('base64url')}`;
    const tokenId = `tid_${randomBytes(12).toString('hex')}`;
    const expiresAtMs = now + this.tokenLifetimeMs;
    rec.tokenId = tokenId;
    rec.expiresAtMs = expiresAtMs;
    rec.generation += 1;
    // Expired tokens can never become valid again (unless a test turns its clock back);
    // under the strict rule the slot's previous token goes too, at this very moment.
    for (const [t, r] of this.#tokens) if (now >= r.expiresAtMs || (this.#strict && r.slot === slot)) this.#tokens.delete(t);
    this.#tokens.set(token, { slot, tokenId, generation: rec.generation, expiresAtMs });
    return {
      slot,
      tokenId,
      token,
      expiresAt: new Date(expiresAtMs).toISOString(),
      credentialGeneration: rec.generation,
    };
  }
}

function ok(answer: Readonly<RenewOk>): RenewResult {
  // A fresh copy each time: a caller mutating its answer cannot change the stored one.
  return { status: 200, body: { ...answer }, headers: { 'cache-control': 'no-store' } };
}

function error(status: number, code: string): RenewResult {
  return { status, body: { error: code } };
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/** Constant-time comparison of a fixed credential (both sides hashed to equal length). */
function toValidator(credential: string | CredentialValidator): CredentialValidator {
  if (typeof credential === 'function') return credential;
  if (credential.length === 0) throw new RangeError('credential must not be empty');
  const expected = digest(credential);
  return (bearer) => timingSafeEqual(digest(bearer), expected);
}
