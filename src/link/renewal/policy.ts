import type { RenewalSlotState } from './renewal-state.js';
import type { RenewOutcome } from './renew-slot.js';
import type { SlotFile } from '../../data/handoff.js';
import { backoffDelay, renewDueAt, type BackoffOptions, type TokenTimes } from './schedule.js';

/**
 * The renewal policy: what fetch does after each answer, as pure functions of the slot's
 * bookkeeping, the outcome and the time (epoch ms). No I/O, no clock, no randomness of its
 * own, so every rule below is a row in a table test:
 *   - 200: settled; next renewal when a third of the new lifetime remains.
 *   - 409: renew again at once against the Gateway's tokenId; from the third conflict in a
 *     row, back off (two hosts fighting over one slot must not storm the Gateway).
 *   - 401: halt every slot until the credential changes (no retry storm on a bad credential).
 *   - 404: the slot is revoked; ask again only after a long pause (apply marks it revoked).
 *   - 429/5xx/network: exponential backoff with full jitter, never sooner than Retry-After,
 *     counted from when the answer arrived.
 */

/** fetch's in-memory bookkeeping for one slot between attempts. */
export interface SlotPolicyState {
  /** Consecutive attempts that did not settle (conflicts, failures) since the last one that did. */
  attempt: number;
  /** No attempt before this time. */
  notBefore: number;
  /** Whether an attempt is still owed (`--once` keeps going until every slot is settled). */
  settled: boolean;
}

export const freshSlot: SlotPolicyState = { attempt: 0, notBefore: 0, settled: true };

/** How long a revoked slot is left alone: apply marks it revoked long before this. */
export const REVOKED_PAUSE_MS = 10 * 60_000;

export interface PolicyOptions {
  backoff: BackoffOptions;
  /** Jitter source, [0, 1). */
  rand?: () => number;
}

export type Decision =
  /** Keep `state` for the slot and attempt again at `at` (or later). */
  | { kind: 'next'; state: SlotPolicyState; at: number; delayMs: number }
  /** The Gateway refused the host credential: stop renewing every slot until it changes. */
  | { kind: 'halt' };

/** The decision after one answer (`now`: when it arrived). */
export function decide(state: SlotPolicyState, outcome: RenewOutcome, now: number, options: PolicyOptions): Decision {
  const rand = options.rand ?? Math.random;
  switch (outcome.kind) {
    case 'renewed': {
      const at = renewDueAt({ tokenId: outcome.tokenId, expiresAt: Date.parse(outcome.expiresAt), issuedAt: now }, rand);
      return { kind: 'next', state: freshSlot, at, delayMs: Math.max(0, at - now) };
    }
    case 'conflict': {
      const attempt = state.attempt + 1;
      const delayMs = attempt > 2 ? backoffDelay(attempt - 2, undefined, options.backoff, rand) : 0;
      return { kind: 'next', state: { attempt, notBefore: now + delayMs, settled: false }, at: now + delayMs, delayMs };
    }
    case 'credential_invalid':
      return { kind: 'halt' };
    case 'revoked':
      return { kind: 'next', state: { attempt: 0, notBefore: now + REVOKED_PAUSE_MS, settled: true }, at: now + REVOKED_PAUSE_MS, delayMs: REVOKED_PAUSE_MS };
    case 'retry': {
      const attempt = state.attempt + 1;
      const delayMs = backoffDelay(attempt, outcome.retryAfterMs, options.backoff, rand);
      return { kind: 'next', state: { attempt, notBefore: now + delayMs, settled: false }, at: now + delayMs, delayMs };
    }
  }
}

/**
 * The token times a slot is scheduled by: what fetch last delivered, if apply has not yet
 * caught up with it (else fetch would renew again what it already renewed), else the
 * applied token of the slot file.
 */
export function tokenTimesOf(slot: SlotFile, saved: RenewalSlotState): TokenTimes {
  const delivered = saved.delivered && saved.delivered.generation >= slot.generation ? saved.delivered : undefined;
  if (delivered) return { tokenId: delivered.tokenId, expiresAt: Date.parse(delivered.expiresAt), issuedAt: Date.parse(delivered.receivedAt) };
  return {
    tokenId: slot.tokenId,
    expiresAt: slot.expiresAt ? Date.parse(slot.expiresAt) : null,
    issuedAt: slot.appliedAt ? Date.parse(slot.appliedAt) : null,
  };
}

/**
 * When the slot's next attempt is due: at once while a renewal is in flight (a persisted
 * requestId, or a tokenId adopted from a 409), else on schedule; never before its backoff.
 */
export function dueAt(slot: SlotFile, saved: RenewalSlotState, state: SlotPolicyState, rand: () => number = Math.random): number {
  const scheduled = saved.pending || saved.adopted !== undefined ? 0 : renewDueAt(tokenTimesOf(slot, saved), rand);
  return Math.max(scheduled, state.notBefore);
}

export { credentialDigest, credentialGate, type CredentialGate } from '../../net/credential-gate.js';

/**
 * A slot's bookkeeping after the credential changed: the backoff of failures (possibly the
 * refused credential's doing) is forgotten; a settled slot (a revocation pause) is kept.
 */
export function afterCredentialChange(state: SlotPolicyState): SlotPolicyState {
  return state.settled ? state : freshSlot;
}
