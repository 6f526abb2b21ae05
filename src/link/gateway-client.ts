import { Agent, buildConnector } from 'undici';
import { linkUrl } from '../data/link-wire.js';
import { sharedPeerUidLookups } from '../http/peer-uid.js';
import { guardedConnector, UpstreamGuard } from '../http/upstream-guard.js';
import type { Logger } from '../log/logger.js';
import { parseRetryAfter } from '../net/backoff.js';
import { BodyTooLargeError, readBodyBounded } from '../net/bounded-body.js';

/**
 * Every call the host makes to the Gateway goes through one client (the way tailscale's
 * controlclient `Direct` owns every control call): one connection pool for the process,
 * a timeout and a body bound on every request, and one reading of what an answer means.
 * Enrol, renewal, the state poll, presence and the audit upload differ only in what they
 * send and in the statuses they give a meaning of their own.
 */

export interface GatewayRequest {
  method: 'GET' | 'POST';
  /** Below the Gateway base URL (a base path, if any, is kept). */
  path: string;
  query?: Record<string, string>;
  /** The host credential, sent as a bearer token; a 401 to a request that carried one halts the link. */
  credential?: string;
  /** JSON text. */
  body?: string;
  /** For the headers and for each pause in the body (undici's per-request timeouts). */
  timeoutMs: number;
  /** An answer longer than this is cut off and is a `retry`: no Gateway answer is read unbounded. */
  maxBodyBytes: number;
  signal?: AbortSignal;
  /** The clock a Retry-After date is read against. */
  now?: () => number;
}

export type GatewayOutcome =
  /** 2xx. */
  | { kind: 'ok'; status: number; body: string }
  /** 401 to the host credential: nothing more goes out with it (host-credential.ts). */
  | { kind: 'halted' }
  /** Worth asking again later: 429, 5xx, network, timeout, an answer over its bound. */
  | { kind: 'retry'; cause: 'status' | 'network' | 'oversize'; reason: string; status?: number; code?: string; retryAfterMs?: number }
  /** Any other status (a 404 or 409 to renewal, a 401 to enrol): the caller says what it means. */
  | { kind: 'status'; status: number; body: string };

/** Enrol, renewal, presence and audit answers are small; the desired state has its own bound. */
export const SMALL_ANSWER_BYTES = 64 * 1024;

/** Never the error's own text: undici's can carry addresses; the code is enough. */
function networkCode(err: unknown, signal?: AbortSignal): string {
  const e = err as { code?: string; cause?: { code?: string } };
  return e.cause?.code ?? e.code ?? (signal?.aborted ? 'aborted' : 'network_error');
}

export interface GatewayClientOptions {
  connectTimeoutMs?: number;
  /** Besides root and our own, users whose plain-http loopback Gateway may get the credential (`--loopback-owner-uids`). */
  loopbackOwnerUids?: ReadonlySet<number> | undefined;
  /** Where a refused connection is reported (the outcome carries only its code). */
  log?: Logger | undefined;
}

export class GatewayClient {
  readonly #agent: Agent;
  readonly #lookups = sharedPeerUidLookups();

  constructor(
    readonly gatewayUrl: string,
    options: GatewayClientOptions = {},
  ) {
    // A plain-http (loopback) Gateway gets the credential, or the pairing code, only from a
    // listener the kernel says is ours, root's or a listed user's: not an agent squatting
    // the port of a stopped one (upstream-guard.ts).
    const guard = new UpstreamGuard({
      what: 'gateway',
      listenerOwner: async () => (await this.#lookups.get()).listenerOwner,
      ownerUids: options.loopbackOwnerUids,
      log: options.log,
    });
    this.#agent = new Agent({ connect: guardedConnector(buildConnector({ timeout: options.connectTimeoutMs ?? 10_000 }), guard) });
  }

  url(path: string, query?: Record<string, string>): URL {
    return linkUrl(this.gatewayUrl, path, query);
  }

  /** One request; never throws for anything the Gateway or the network does. */
  async request(req: GatewayRequest): Promise<GatewayOutcome> {
    const url = this.url(req.path, req.query);
    const headers: Record<string, string> = { accept: 'application/json' };
    if (req.credential !== undefined) headers.authorization = `Bearer ${req.credential}`;
    if (req.body !== undefined) headers['content-type'] = 'application/json';
    let status: number;
    let retryAfter: string | string[] | undefined;
    let body: string;
    try {
      const res = await this.#agent.request({
        origin: url.origin,
        path: url.pathname + url.search,
        method: req.method,
        headers,
        body: req.body,
        signal: req.signal,
        headersTimeout: req.timeoutMs,
        bodyTimeout: req.timeoutMs,
      });
      status = res.statusCode;
      retryAfter = res.headers['retry-after'];
      body = await readBodyBounded(res.body, req.maxBodyBytes);
    } catch (err) {
      if (err instanceof BodyTooLargeError) return { kind: 'retry', cause: 'oversize', reason: `answer larger than ${req.maxBodyBytes} bytes` };
      const code = networkCode(err, req.signal);
      return { kind: 'retry', cause: 'network', reason: `network: ${code}`, code };
    }
    if (status >= 200 && status < 300) return { kind: 'ok', status, body };
    if (status === 401 && req.credential !== undefined) return { kind: 'halted' };
    if (status === 429 || status >= 500) return { kind: 'retry', cause: 'status', status, reason: `status ${status}`, retryAfterMs: parseRetryAfter(retryAfter, (req.now ?? Date.now)()) };
    return { kind: 'status', status, body };
  }

  async close(): Promise<void> {
    await this.#agent.destroy().catch(() => undefined);
    await this.#lookups.close();
  }
}
