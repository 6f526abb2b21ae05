import { randomUUID } from 'node:crypto';
import type { Logger } from '../../log/logger.js';
import { crashPoint } from '../../service/test-hooks.js';
import type { HandoffPaths, SlotFile } from '../../data/handoff.js';
import { parseJsonWith } from '../../data/parse.js';
import type { RenewalSlotState, RenewalState } from './renewal-state.js';
import { renewConflictSchema, renewOkSchema, renewPath } from '../../data/renew-wire.js';
import { SMALL_ANSWER_BYTES } from '../gateway-client.js';
import type { HostCredential } from '../host-credential.js';
import type { InboxBatcher } from './inbox-batcher.js';

export interface RenewDeps {
  paths: HandoffPaths;
  state: RenewalState;
  /**
   * The hand-off to apply: one batcher per link, shared by every renewal, so answers
   * arriving together share one durable file (inbox-batcher.ts).
   */
  inbox: InboxBatcher;
  /** Sends the renewal; a 401 to it halts the whole link. */
  credential: HostCredential;
  log: Logger;
  signal?: AbortSignal;
  /**
   * This attempt's own controller (its stop, its slot's retirement): the request is cut by
   * aborting it, a halt of the link included, with no second signal combined per renewal
   * (host-credential.ts). When given, `signal` is not used.
   */
  cut?: AbortController;
  now?: () => number;
}

export type RenewOutcome =
  | { kind: 'renewed'; tokenId: string; expiresAt: string }
  | { kind: 'conflict'; currentTokenId: string | null }
  | { kind: 'credential_invalid' }
  | { kind: 'revoked' }
  /** `status`: the Gateway's answer (429, 5xx), absent for a network failure or an unusable answer. */
  | { kind: 'retry'; reason: string; status?: number; retryAfterMs?: number };

/** Renewal answers are small and quick; a hung Gateway must not wedge a slot forever. */
export const RENEW_TIMEOUT_MS = 30_000;

/**
 * What fetch believes the Gateway holds for this slot, newest first: a tokenId adopted from
 * a 409, else the newer of the token last delivered to apply and the one apply applied.
 */
export function expectationFor(slot: SlotFile, state: RenewalSlotState): string | null {
  if (state.adopted !== undefined) return state.adopted;
  if (state.delivered && state.delivered.generation >= slot.generation) return state.delivered.tokenId;
  return slot.tokenId;
}

/**
 * One renewal attempt for one slot. The requestId is made durable before anything is
 * sent and reused until the renewal settles, so a crash at any point, or a lost answer,
 * can never mint a second token: the retry is answered with the one already minted.
 */
export async function renewSlot(deps: RenewDeps, slot: SlotFile, credential: string): Promise<RenewOutcome> {
  const { log } = deps;
  const now = deps.now ?? Date.now;
  let state = await deps.state.read(slot.slot);
  if (!state.pending) {
    state = {
      ...state,
      pending: { requestId: randomUUID(), expectedTokenId: expectationFor(slot, state), since: new Date(now()).toISOString() },
    };
    await deps.state.write(state);
  }
  const pending = state.pending as NonNullable<RenewalSlotState['pending']>;
  crashPoint('fetch-after-persist');

  const answer = await deps.credential.request(credential, {
    method: 'POST',
    path: renewPath(slot.slot),
    body: JSON.stringify({ requestId: pending.requestId, expectedTokenId: pending.expectedTokenId }),
    timeoutMs: RENEW_TIMEOUT_MS,
    maxBodyBytes: SMALL_ANSWER_BYTES,
    ...(deps.cut ? { signal: deps.cut.signal } : deps.signal && { signal: deps.signal }),
    now,
  }, deps.cut && { cut: deps.cut });
  if (answer.kind === 'halted') return { kind: 'credential_invalid' };
  if (answer.kind !== 'retry' || answer.cause === 'status') crashPoint('fetch-after-receive');
  if (answer.kind === 'retry') {
    return {
      kind: 'retry',
      reason: answer.reason,
      ...(answer.status !== undefined && { status: answer.status }),
      ...(answer.retryAfterMs !== undefined && { retryAfterMs: answer.retryAfterMs }),
    };
  }
  const { status, body: text } = answer;

  if (status === 200) {
    const ok = parseJsonWith(renewOkSchema, text);
    if (!ok.ok || ok.value.slot !== slot.slot) {
      log.error({ slot: slot.slot, error: ok.ok ? 'slot mismatch' : ok.error }, 'gateway sent an invalid renewal answer; retrying');
      return { kind: 'retry', reason: 'invalid answer' };
    }
    const body = ok.value;
    // Resolved once the batch holding it is durable; a failed write throws here, nothing is
    // recorded, and the renewal is retried with the same requestId.
    await deps.inbox.deliver(body);
    crashPoint('fetch-after-inbox');
    // The batch file, fsynced, is what must survive (renewal-state.ts's write()).
    await deps.state.write({
      slot: slot.slot,
      delivered: { tokenId: body.tokenId, expiresAt: body.expiresAt, generation: body.credentialGeneration, receivedAt: new Date(now()).toISOString() },
    });
    return { kind: 'renewed', tokenId: body.tokenId, expiresAt: body.expiresAt };
  }
  if (status === 409) {
    const conflict = parseJsonWith(renewConflictSchema, text);
    if (!conflict.ok) return { kind: 'retry', reason: 'invalid 409 answer' };
    // A 409 commits nothing: settle this requestId and renew again expecting what the
    // Gateway holds now (null when it holds nothing).
    const { pending: _settled, ...rest } = state;
    await deps.state.write({ ...rest, adopted: conflict.value.currentTokenId });
    return { kind: 'conflict', currentTokenId: conflict.value.currentTokenId };
  }
  if (status === 404) {
    await deps.inbox.deliver({ slot: slot.slot, revoked: true, at: new Date(now()).toISOString() });
    const { pending: _settled, ...rest } = state;
    await deps.state.write(rest);
    return { kind: 'revoked' };
  }
  return { kind: 'retry', reason: `status ${status}` };
}
