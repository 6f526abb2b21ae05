import type { IncomingMessage, ServerResponse } from 'node:http';
import { RenewAuthority, type RenewAuthorityOptions, type RenewResult } from '../../src/dev/demo-gateway/authority.js';
import { parseRenewHttp, sendRenewResult } from '../../src/dev/demo-gateway/gateway-http.js';
import { Wakeups } from './wakeups.js';
import { LoopbackServer } from './loopback-server.js';

/**
 * The cloud Gateway's renewal endpoint for tests (not our code, so a mock is fair, but a
 * faithful one): a real `RenewAuthority` (idempotency, CAS, expiry) behind the same HTTP
 * glue as the dev demo Gateway, on 127.0.0.1:<random port>, plus fault injection.
 *
 * Faults are a FIFO queue of one-shot faults. Each renewal request (a valid POST on the
 * renewal path) takes the first queued fault that is unscoped or scoped to its slot;
 * requests the HTTP layer rejects (400/405/413) take none.
 *
 *   dropAfterCommit   renew normally (commit, mint), then destroy the socket: lost answer
 *   resetBeforeCommit destroy the socket (TCP RST) before the authority sees the request
 *   slow {ms}         renew normally (commit now), answer after ms; if the client gave up
 *                     meanwhile the answer is lost but the commit stays
 *   hang {commit?}    never answer (commit first only if commit: true)
 *   status409         answer 409 with the slot's real currentTokenId, state untouched
 *   status429 {retryAfterS}  429 with `Retry-After` (seconds, or an HTTP date string)
 *   status5xx {status}       that status (default 503), state untouched
 *   status401 / status404    that answer, state untouched
 *
 * `rateLimitWindow(ms, retryAfterS)`: a Gateway shedding load for a while; every renewal
 * without a queued fault is answered 429 for `ms` from the first one that meets it.
 *
 * To simulate another host having renewed the slot (a genuine CAS conflict), use
 * `advanceElsewhere(slot)`.
 *
 * Every request is recorded without the credential: only whether Authorization was
 * present.
 */

export type RenewFault =
  | { kind: 'dropAfterCommit' }
  | { kind: 'resetBeforeCommit' }
  | { kind: 'slow'; ms: number }
  | { kind: 'hang'; commit?: boolean }
  | { kind: 'status409' }
  | { kind: 'status429'; retryAfterS?: number | string }
  | { kind: 'status5xx'; status?: number }
  | { kind: 'status401' }
  | { kind: 'status404' };

export type FaultKind = RenewFault['kind'];

/** How a request ended, as the Gateway saw it. */
export type RenewOutcome = number | 'dropped' | 'reset' | 'hang' | 'client_gone' | 'pending';

export interface RenewRecord {
  /** Order of arrival, from 1. */
  seq: number;
  /** Wall clock (Date.now) when the request arrived. */
  at: number;
  method: string;
  path: string;
  /** The decoded slot, if the path named a valid one. */
  slot: string | undefined;
  requestId: string | undefined;
  expectedTokenId: string | null | undefined;
  /** Whether an Authorization header was present. The credential itself is never kept. */
  authorization: boolean;
  fault: FaultKind | undefined;
  /** Whether the authority committed (minted or replayed a 200) for this request. */
  committed: boolean;
  outcome: RenewOutcome;
}

export interface MockRenewGatewayOptions extends Partial<RenewAuthorityOptions> {
  /** Default `test-host-credential`. */
  credential?: RenewAuthorityOptions['credential'];
  /** Default 60 s. */
  tokenLifetimeMs?: number;
}

interface QueuedFault {
  fault: RenewFault;
  slot: string | undefined;
}

export const DEFAULT_TEST_CREDENTIAL = 'test-host-credential';

export class MockRenewGateway {
  readonly authority: RenewAuthority;
  readonly requests: RenewRecord[] = [];
  /** Faults injected so far, per kind (for the closing figures). */
  readonly faultsFired: Partial<Record<FaultKind, number>> = {};
  private readonly server: LoopbackServer;
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly faults: QueuedFault[] = [];
  private readonly arrivals = new Wakeups();
  /** Requests open now (arrived, not yet answered or dropped) and the most ever at once. */
  inflight = 0;
  maxInflight = 0;
  private gate: { n: number; held: (() => void)[] } | undefined;
  private storm: { ms: number; retryAfterS: number; until: number | undefined } | undefined;

  constructor(options: MockRenewGatewayOptions = {}) {
    this.authority = new RenewAuthority({
      ...options,
      credential: options.credential ?? DEFAULT_TEST_CREDENTIAL,
      tokenLifetimeMs: options.tokenLifetimeMs ?? 60_000,
    });
    this.server = new LoopbackServer((req, res) => void this.onRequest(req, res));
  }

  static async start(options: MockRenewGatewayOptions = {}): Promise<MockRenewGateway> {
    const gw = new MockRenewGateway(options);
    await gw.server.listen();
    return gw;
  }

  /** The Gateway base URL (what fetch is given as gatewayUrl). */
  get port(): number {
    return this.server.port;
  }

  get url(): string {
    return this.server.url();
  }

  /** Queues a one-shot fault, optionally only for one slot, `times` times. */
  inject(fault: RenewFault, options: { slot?: string; times?: number } = {}): void {
    for (let i = 0; i < (options.times ?? 1); i++) this.faults.push({ fault, slot: options.slot });
  }

  /** Faults still queued (optionally only those that would apply to `slot`). */
  pendingFaults(slot?: string): number {
    return slot === undefined ? this.faults.length : this.faults.filter((f) => f.slot === undefined || f.slot === slot).length;
  }

  clearFaults(): void {
    this.faults.length = 0;
  }

  totalFaultsFired(): number {
    return Object.values(this.faultsFired).reduce((a, b) => a + b, 0);
  }

  createSlot(slot: string): void {
    this.authority.createSlot(slot);
  }

  revokeSlot(slot: string): void {
    this.authority.revokeSlot(slot);
  }

  /** Another host renewed this slot: the client's expectedTokenId is now stale. */
  advanceElsewhere(slot: string): { tokenId: string; generation: number } {
    return this.authority.mintElsewhere(slot);
  }

  /** Rotates (or, with a validator returning false, invalidates) the accepted credential. */
  setCredential(credential: RenewAuthorityOptions['credential']): void {
    this.authority.setCredential(credential);
  }

  /** Tokens minted by renewals (all slots, or one slot). */
  minted(slot?: string): number {
    const stats = this.authority.stats();
    return slot === undefined ? stats.minted : (stats.perSlotMinted[slot] ?? 0);
  }

  /** Recorded requests for a slot. */
  requestsFor(slot: string): RenewRecord[] {
    return this.requests.filter((r) => r.slot === slot);
  }

  /** Resolves once at least `n` requests have arrived; returns the n-th. */
  async waitForRequests(n: number): Promise<RenewRecord> {
    while (this.requests.length < n) await this.arrivals.next();
    return this.requests[n - 1] as RenewRecord;
  }

  /**
   * Holds every request until `n` are open at once, then lets them all go and stops
   * holding: a client that never has `n` renewals in flight waits forever (its test times
   * out), one that has proves it by event, not by timing.
   */
  holdUntilInflight(n: number): void {
    this.gate = { n, held: [] };
  }

  /** See the class comment: 429 to every renewal for `ms` from the first it meets. */
  rateLimitWindow(ms: number, retryAfterS: number): void {
    this.storm = { ms, retryAfterS, until: undefined };
  }

  private takeFault(slot: string): RenewFault | undefined {
    const storm = this.storm;
    if (storm && this.faults.every((f) => f.slot !== undefined && f.slot !== slot)) {
      storm.until ??= Date.now() + storm.ms;
      if (Date.now() < storm.until) {
        this.faultsFired.status429 = (this.faultsFired.status429 ?? 0) + 1;
        return { kind: 'status429', retryAfterS: storm.retryAfterS };
      }
      this.storm = undefined;
    }
    const i = this.faults.findIndex((f) => f.slot === undefined || f.slot === slot);
    if (i === -1) return undefined;
    const [q] = this.faults.splice(i, 1);
    if (!q) return undefined;
    this.faultsFired[q.fault.kind] = (this.faultsFired[q.fault.kind] ?? 0) + 1;
    return q.fault;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.inflight += 1;
    this.maxInflight = Math.max(this.maxInflight, this.inflight);
    res.once('close', () => {
      this.inflight -= 1;
    });
    const gate = this.gate;
    if (gate) {
      if (this.inflight >= gate.n) {
        this.gate = undefined;
        for (const go of gate.held) go();
      } else {
        await new Promise<void>((go) => gate.held.push(go));
      }
    }
    const rec: RenewRecord = {
      seq: 0,
      at: Date.now(),
      method: req.method ?? '',
      path: req.url ?? '',
      slot: undefined,
      requestId: undefined,
      expectedTokenId: undefined,
      authorization: req.headers.authorization !== undefined,
      fault: undefined,
      committed: false,
      outcome: 'pending',
    };
    const parse = await parseRenewHttp(req);
    if (parse.kind === 'not_renew') {
      this.record(rec);
      rec.outcome = 404;
      sendRenewResult(res, { status: 404, body: { error: 'not_found' } });
      return;
    }
    if (parse.kind === 'client_gone') {
      this.record(rec);
      rec.outcome = 'client_gone';
      res.destroy();
      return;
    }
    if (parse.kind === 'answer') {
      rec.slot = parse.slot;
      this.record(rec);
      this.send(res, rec, parse.result);
      return;
    }
    const { slot, bearer, body } = parse.request;
    rec.slot = slot;
    rec.requestId = body.requestId;
    rec.expectedTokenId = body.expectedTokenId;
    const fault = this.takeFault(slot);
    rec.fault = fault?.kind;
    this.record(rec);

    const commit = (): RenewResult => {
      const result = this.authority.renew(slot, bearer, body);
      rec.committed = result.status === 200;
      return result;
    };

    switch (fault?.kind) {
      case undefined:
        this.send(res, rec, commit());
        return;
      case 'dropAfterCommit':
        commit();
        rec.outcome = 'dropped';
        req.socket.destroy();
        return;
      case 'resetBeforeCommit':
        rec.outcome = 'reset';
        req.socket.resetAndDestroy();
        return;
      case 'slow': {
        const result = commit();
        const timer = setTimeout(() => {
          this.timers.delete(timer);
          if (res.destroyed) rec.outcome = 'client_gone';
          else this.send(res, rec, result);
        }, fault.ms);
        this.timers.add(timer);
        return;
      }
      case 'hang':
        if (fault.commit) commit();
        rec.outcome = 'hang';
        return;
      case 'status409': {
        const current = this.authority.slotState(slot)?.tokenId ?? null;
        this.send(res, rec, { status: 409, body: { error: 'token_conflict', currentTokenId: current } });
        return;
      }
      case 'status429': {
        const retryAfter = String(fault.retryAfterS ?? 1);
        this.send(res, rec, { status: 429, body: { error: 'rate_limited' }, headers: { 'retry-after': retryAfter } });
        return;
      }
      case 'status5xx':
        this.send(res, rec, { status: fault.status ?? 503, body: { error: 'gateway_unavailable' } });
        return;
      case 'status401':
        this.send(res, rec, { status: 401, body: { error: 'host_credential_invalid' } });
        return;
      case 'status404':
        this.send(res, rec, { status: 404, body: { error: 'slot_not_found' } });
        return;
    }
  }

  private record(rec: RenewRecord): void {
    rec.seq = this.requests.length + 1;
    this.requests.push(rec);
    this.arrivals.wake();
  }

  private send(res: ServerResponse, rec: RenewRecord, result: RenewResult): void {
    rec.outcome = result.status;
    sendRenewResult(res, result);
  }

  async close(): Promise<void> {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    await this.server.close();
  }
}
