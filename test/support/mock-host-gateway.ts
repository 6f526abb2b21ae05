import type { IncomingMessage, ServerResponse } from 'node:http';
import { RenewAuthority, type RenewAuthorityOptions } from '../../src/dev/demo-gateway/authority.js';
import { handleRenewHttp } from '../../src/dev/demo-gateway/gateway-http.js';
import { HostControl, type LinkResult } from '../../src/dev/demo-gateway/host-control.js';
import type { AuditUpload } from '../../src/data/audit-event.js';
import { answerStatePoll, parseHostHttp, sendLinkResult, type HostEndpoint } from '../../src/dev/demo-gateway/host-http.js';
import { LoopbackServer } from './loopback-server.js';

/**
 * The cloud Gateway's host link (SPEC §8) for tests: a real `HostControl` (one-time codes,
 * requestId idempotency, whole-state long poll, presence) sharing its credentials with a
 * real `RenewAuthority` (so an enrolled host can renew), behind the same HTTP glue as the
 * dev demo Gateway, on 127.0.0.1:<random port>, plus fault injection.
 *
 * Faults are a FIFO queue of one-shot faults, each optionally scoped to one endpoint. A
 * link request the HTTP layer accepted (parsed, schema-valid) takes the first queued fault
 * that is unscoped or scoped to its endpoint; 400/405/413 answers take none.
 *
 *   status5xx {status}        that status (default 503); nothing committed
 *   status429 {retryAfterS}   429 with Retry-After (seconds or an HTTP date)
 *   dropBeforeCommit          destroy the socket before HostControl sees the request
 *   dropAfterCommit           enrol/presence/audit: commit, then destroy the socket (lost answer);
 *                             state: a long poll cut while it waits (no answer ever)
 *   hang                      never answer (the socket stays open until close())
 *   commitThenHang            audit: store the events, then never answer (a link killed
 *                             mid-batch, or timing out, resends them)
 *   notJson                   200 with an HTML body
 *   badSchema                 200 with JSON that fails the endpoint's answer schema
 *   body {body}               200 with this JSON body (crafted states: see `craftedStates`)
 *
 * Requests are recorded without the pairing code and without the credential (only whether
 * Authorization was present).
 */

export type HostFault =
  | { kind: 'status5xx'; status?: number }
  | { kind: 'status429'; retryAfterS?: number | string }
  | { kind: 'dropBeforeCommit' }
  | { kind: 'dropAfterCommit' }
  | { kind: 'hang' }
  | { kind: 'commitThenHang' }
  | { kind: 'notJson' }
  | { kind: 'badSchema' }
  | { kind: 'body'; body: unknown };

export type HostFaultKind = HostFault['kind'];

export type HostOutcome = number | 'dropped' | 'hang' | 'client_gone' | 'pending';

export interface HostRequestRecord {
  seq: number;
  at: number;
  endpoint: HostEndpoint | undefined;
  method: string;
  /** Path and query (`?after=N`); no secret travels in a link URL. */
  path: string;
  /** Enrol only. */
  requestId: string | undefined;
  /** State only. */
  after: number | undefined;
  authorization: boolean;
  fault: HostFaultKind | undefined;
  outcome: HostOutcome;
}

export interface MockHostGatewayOptions {
  /** State long poll hold time. Default 60 s; tests that wait for a 204 set it short. */
  longPollMs?: number;
  /** Credentials accepted without enrolment, by hostId. */
  staticHosts?: Record<string, string>;
  tokenLifetimeMs?: number;
  tokenValidity?: RenewAuthorityOptions['tokenValidity'];
}

const BINDING = { instanceId: 'inst-crafted', upstreamUrl: 'https://gw.example.com/mcp' };
const PROVIDER = { upstream: 'https://api.example.com', inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [] };

/** 200 bodies for `{kind: 'body'}`: states a host must refuse whole (and one it must take). */
export const craftedStates = {
  httpUpstream: (version: number) => ({ version, bindings: { bind_crafted_01: { ...BINDING, upstreamUrl: 'http://gw.example.com/mcp' } }, providers: {} }),
  httpProviderUpstream: (version: number) => ({ version, bindings: {}, providers: { crafted: { ...PROVIDER, upstream: 'http://api.example.com' } } }),
  reservedHeader: (version: number) => ({
    version,
    bindings: {},
    providers: { crafted: { ...PROVIDER, inject: { type: 'header', name: 'Host', value: '{token}' } } },
  }),
  dotdotProvider: (version: number) => ({ version, bindings: {}, providers: { '../crafted': PROVIDER } }),
  tokenPathNamed: (version: number) => ({ version, bindings: { bind_crafted_01: { ...BINDING, tokenFile: '/etc/passwd' } }, providers: {} }),
  /** Valid: `n` bindings in one state (the scale a host must take quickly). */
  manyBindings: (version: number, n = 10_000) => ({
    version,
    bindings: Object.fromEntries(
      Array.from({ length: n }, (_, i) => [`bind_${String(i).padStart(8, '0')}`, { instanceId: `inst-${i}`, upstreamUrl: `https://gw.example.com/mcp/${i}` }]),
    ),
    providers: {},
  }),
};

interface QueuedFault {
  fault: HostFault;
  endpoint: HostEndpoint | undefined;
}

export class MockHostGateway {
  readonly authority: RenewAuthority;
  readonly control: HostControl;
  readonly requests: HostRequestRecord[] = [];
  readonly faultsFired: Partial<Record<HostFaultKind, number>> = {};
  /** Every schema-valid audit upload body, as received (the secret-grep test reads them). */
  readonly auditBodies: AuditUpload[] = [];
  private readonly server: LoopbackServer;
  private readonly faults: QueuedFault[] = [];
  private waiters: Array<() => void> = [];

  constructor(options: MockHostGatewayOptions = {}) {
    this.authority = new RenewAuthority({
      // Replaced at once by HostControl's validator; never accepted on its own.
      credential: () => false,
      tokenLifetimeMs: options.tokenLifetimeMs ?? 60_000,
      ...(options.tokenValidity ? { tokenValidity: options.tokenValidity } : {}),
    });
    this.control = new HostControl({
      authority: this.authority,
      ...(options.longPollMs === undefined ? {} : { longPollMs: options.longPollMs }),
      ...(options.staticHosts ? { staticHosts: options.staticHosts } : {}),
    });
    this.server = new LoopbackServer((req, res) => void this.onRequest(req, res));
  }

  static async start(options: MockHostGatewayOptions = {}): Promise<MockHostGateway> {
    const gw = new MockHostGateway(options);
    await gw.server.listen();
    return gw;
  }

  get port(): number {
    return this.server.port;
  }

  get url(): string {
    return this.server.url();
  }

  inject(fault: HostFault, options: { endpoint?: HostEndpoint; times?: number } = {}): void {
    for (let i = 0; i < (options.times ?? 1); i++) this.faults.push({ fault, endpoint: options.endpoint });
  }

  pendingFaults(): number {
    return this.faults.length;
  }

  requestsTo(endpoint: HostEndpoint): HostRequestRecord[] {
    return this.requests.filter((r) => r.endpoint === endpoint);
  }

  /** Resolves once at least `n` requests have arrived; returns the n-th. */
  async waitForRequests(n: number): Promise<HostRequestRecord> {
    while (this.requests.length < n) await new Promise<void>((r) => this.waiters.push(r));
    return this.requests[n - 1] as HostRequestRecord;
  }

  private takeFault(endpoint: HostEndpoint): HostFault | undefined {
    const i = this.faults.findIndex((f) => f.endpoint === undefined || f.endpoint === endpoint);
    if (i === -1) return undefined;
    const [q] = this.faults.splice(i, 1);
    if (!q) return undefined;
    this.faultsFired[q.fault.kind] = (this.faultsFired[q.fault.kind] ?? 0) + 1;
    return q.fault;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const rec: HostRequestRecord = {
      seq: 0,
      at: Date.now(),
      endpoint: undefined,
      method: req.method ?? '',
      path: req.url ?? '',
      requestId: undefined,
      after: undefined,
      authorization: req.headers.authorization !== undefined,
      fault: undefined,
      outcome: 'pending',
    };
    // The renewal endpoint is served too, so an enrolled host can renew against this mock.
    if (await handleRenewHttp(this.authority, req, res)) return;
    const parse = await parseHostHttp(req);
    switch (parse.kind) {
      case 'not_host':
        this.record(rec);
        return this.send(res, rec, { status: 404, body: { error: 'not_found' } });
      case 'client_gone':
        rec.endpoint = parse.endpoint;
        rec.outcome = 'client_gone';
        this.record(rec);
        res.destroy();
        return;
      case 'answer':
        rec.endpoint = parse.endpoint;
        this.record(rec);
        return this.send(res, rec, parse.result);
      case 'enroll':
        rec.endpoint = 'enroll';
        rec.requestId = parse.body.requestId;
        break;
      case 'state':
        rec.endpoint = 'state';
        rec.after = parse.after;
        break;
      case 'presence':
        rec.endpoint = 'presence';
        break;
      case 'audit':
        rec.endpoint = 'audit';
        this.auditBodies.push(parse.body);
        break;
    }
    const endpoint = rec.endpoint;
    const fault = this.takeFault(endpoint);
    rec.fault = fault?.kind;
    this.record(rec);

    const commit = async (): Promise<void> => {
      if (parse.kind === 'enroll') this.send(res, rec, this.control.enroll(parse.body));
      else if (parse.kind === 'presence') this.send(res, rec, this.control.presence(parse.bearer, parse.body));
      else if (parse.kind === 'audit') this.send(res, rec, this.control.audit(parse.bearer, parse.body));
      else if (parse.kind === 'state') {
        await answerStatePoll(this.control, res, parse.bearer, parse.after);
        rec.outcome = res.writableEnded ? res.statusCode : 'client_gone';
      }
    };

    switch (fault?.kind) {
      case undefined:
        return commit();
      case 'status5xx':
        return this.send(res, rec, { status: fault.status ?? 503, body: { error: 'gateway_unavailable' } });
      case 'status429':
        return this.send(res, rec, { status: 429, body: { error: 'rate_limited' }, headers: { 'retry-after': String(fault.retryAfterS ?? 1) } });
      case 'dropBeforeCommit':
        rec.outcome = 'dropped';
        req.socket.destroy();
        return;
      case 'dropAfterCommit':
        rec.outcome = 'dropped';
        if (parse.kind === 'enroll') this.control.enroll(parse.body);
        else if (parse.kind === 'presence') this.control.presence(parse.bearer, parse.body);
        else if (parse.kind === 'audit') this.control.audit(parse.bearer, parse.body);
        else {
          // A long poll cut while held: the client has waited, then loses the connection.
          setImmediate(() => req.socket.destroy());
          return;
        }
        req.socket.destroy();
        return;
      case 'hang':
        rec.outcome = 'hang';
        return;
      case 'commitThenHang':
        rec.outcome = 'hang';
        if (parse.kind === 'audit') this.control.audit(parse.bearer, parse.body);
        return;
      case 'notJson':
        rec.outcome = 200;
        res.writeHead(200, { 'content-type': 'text/html' });
        res.end('<html><body>502 Bad Gateway (proxy)</body></html>');
        return;
      case 'badSchema':
        rec.outcome = 200;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(endpoint === 'state' ? { version: 'latest', bindings: [] } : { hostId: 7, token: null }));
        return;
      case 'body': {
        rec.outcome = 200;
        const text = JSON.stringify(fault.body);
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
        res.end(text);
        return;
      }
    }
  }

  private record(rec: HostRequestRecord): void {
    rec.seq = this.requests.length + 1;
    this.requests.push(rec);
    for (const w of this.waiters.splice(0)) w();
  }

  private send(res: ServerResponse, rec: HostRequestRecord, result: LinkResult): void {
    rec.outcome = result.status;
    sendLinkResult(res, result);
  }

  async close(): Promise<void> {
    this.control.close();
    await this.server.close();
  }
}
