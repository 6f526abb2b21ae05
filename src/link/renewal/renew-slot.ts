import { randomUUID } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { Agent } from 'undici';
import { atomicWrite } from '../../fs/atomic-write.js';
import type { Logger } from '../../log/logger.js';
import { crashPoint } from '../../service/test-hooks.js';
import { slotFileName, type HandoffPaths, type SlotFile } from '../../data/handoff.js';
import { parseJsonWith } from '../../data/parse.js';
import type { FetchSlotState, FetchState } from './renewal-state.js';
import { parseRetryAfter } from './schedule.js';
import { renewConflictSchema, renewOkSchema, renewUrl } from '../../data/renew-wire.js';

export interface FetchDeps {
  gatewayUrl: string;
  paths: HandoffPaths;
  state: FetchState;
  agent: Agent;
  log: Logger;
  now?: () => number;
}

export type RenewOutcome =
  | { kind: 'renewed'; tokenId: string; expiresAt: string }
  | { kind: 'conflict'; currentTokenId: string | null }
  | { kind: 'credential_invalid' }
  | { kind: 'revoked' }
  | { kind: 'retry'; reason: string; retryAfterMs?: number };

export function createFetchAgent(): Agent {
  // Renewal answers are small and quick; a hung Gateway must not wedge a slot forever.
  return new Agent({ headersTimeout: 30_000, bodyTimeout: 30_000, connect: { timeout: 10_000 } });
}

/**
 * What fetch believes the Gateway holds for this slot, newest first: a tokenId adopted from
 * a 409, else the newer of the token last delivered to apply and the one apply applied.
 */
export function expectationFor(slot: SlotFile, state: FetchSlotState): string | null {
  if (state.adopted !== undefined) return state.adopted;
  if (state.delivered && state.delivered.generation >= slot.generation) return state.delivered.tokenId;
  return slot.tokenId;
}

/**
 * One renewal attempt for one slot. The requestId is made durable before anything is
 * sent and reused until the renewal settles, so a crash at any point, or a lost answer,
 * can never mint a second token: the retry is answered with the one already minted.
 */
export async function renewSlot(deps: FetchDeps, slot: SlotFile, credential: string): Promise<RenewOutcome> {
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
  const pending = state.pending as NonNullable<FetchSlotState['pending']>;
  crashPoint('fetch-after-persist');

  let status: number;
  let text: string;
  let retryAfter: string | string[] | undefined;
  try {
    const url = renewUrl(deps.gatewayUrl, slot.slot);
    const res = await deps.agent.request({
      origin: url.origin,
      path: url.pathname + url.search,
      method: 'POST',
      headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json', accept: 'application/json' },
      body: JSON.stringify({ requestId: pending.requestId, expectedTokenId: pending.expectedTokenId }),
    });
    status = res.statusCode;
    retryAfter = res.headers['retry-after'];
    text = await res.body.text();
  } catch (err) {
    // Never the error's text: it can carry the Gateway's address details; the code is enough.
    const code = (err as { code?: string }).code ?? 'network_error';
    return { kind: 'retry', reason: `network: ${code}` };
  }
  crashPoint('fetch-after-receive');

  if (status === 200) {
    const ok = parseJsonWith(renewOkSchema, text);
    if (!ok.ok || ok.value.slot !== slot.slot) {
      log.error({ slot: slot.slot, error: ok.ok ? 'slot mismatch' : ok.error }, 'gateway sent an invalid renewal answer; retrying');
      return { kind: 'retry', reason: 'invalid answer' };
    }
    const body = ok.value;
    await mkdir(deps.paths.inbox, { recursive: true });
    await atomicWrite(join(deps.paths.inbox, slotFileName(slot.slot)), `${JSON.stringify(body)}\n`, {
      mode: 0o640,
      midWrite: () => crashPoint('fetch-mid-inbox-write'),
    });
    crashPoint('fetch-after-inbox');
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
  if (status === 401) return { kind: 'credential_invalid' };
  if (status === 404) {
    await mkdir(deps.paths.inbox, { recursive: true });
    await atomicWrite(
      join(deps.paths.inbox, slotFileName(slot.slot)),
      `${JSON.stringify({ slot: slot.slot, revoked: true, at: new Date(now()).toISOString() })}\n`,
      { mode: 0o640 },
    );
    const { pending: _settled, ...rest } = state;
    await deps.state.write(rest);
    return { kind: 'revoked' };
  }
  return { kind: 'retry', reason: `status ${status}`, retryAfterMs: parseRetryAfter(retryAfter, now()) };
}
