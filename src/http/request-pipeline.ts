import type { Socket } from 'node:net';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { AppError, ClientGoneError, sendError, toAppError } from '../errors.js';
import { accessLogFor } from '../log/access-line.js';
import type { Logger } from '../log/logger.js';

import { firstValue } from './headers.js';
import { requestId } from './request-id.js';
import { checkHost, checkOrigin, type Check } from './loopback.js';

import type { InFlight } from './server.js';

/**
 * What one request did, for its single access-log line. Never a token, header value or
 * body: only the shape of the call. Parts add their own fields (binding, provider…).
 */
export interface AccessRecord {
  reqId: string;
  method: string;
  status?: number;
  upstreamStatus?: number;
  bytesIn: number;
  bytesOut: number;
  outcome: string;
  /** Why no token could be used (missing, empty, unreadable, malformed). */
  tokenProblem?: string;
  /** Why a loopback check refused the request (a fixed phrase, never the header's value). */
  refused?: string;
  [field: string]: string | number | boolean | undefined;
}

export interface PipelineDeps {
  log: Logger;
  inflight: InFlight;
  /** The port actually bound (known only after listen when --listen used port 0). */
  port: () => number;
  /** The extra port (loopback-service `sidePorts`) a connection came in on; the Host check names that one. */
  sidePort?: ((socket: Socket) => number | undefined) | undefined;
  stopping: () => boolean;
  /** With `allowedUids` set: whether this connection's peer UID was allowed (decided once per connection). */
  peerAllowed?: ((req: IncomingMessage) => Promise<boolean>) | undefined;
  /** With `peerUids` or `allowedUids` set: the UID of this connection's peer (read once per connection). */
  peerUid?: ((req: IncomingMessage) => Promise<number | undefined>) | undefined;
  /**
   * The connection's peer once both answers above are in (undefined until then): every
   * later request on the connection reads them without waiting. A keep-alive agent sends
   * all its calls on a few connections, so in the units (which always check the peer) this
   * is nearly every request.
   */
  peerKnown?: ((req: IncomingMessage) => KnownPeer | undefined) | undefined;
  observer?: RequestObserver | undefined;
  /**
   * The per-UID and process limits (src/http/peer-limits.ts): nothing, the refusal to
   * answer, or 'answered' when the connection itself was refused (its answer already written).
   */
  admit?: ((req: IncomingMessage, res: ServerResponse) => Admission | Promise<Admission>) | undefined;
}

/** The limits' word on a request: nothing, its refusal, or 'answered' (the connection was refused). */
export type Admission = AppError | 'answered' | undefined;

/** What the peer check said of a connection: whether it may be served, and its UID (undefined: unknown). */
export interface KnownPeer {
  allowed: boolean;
  uid: number | undefined;
}

/**
 * What a part's metrics see of its requests (src/metrics implements it; the pipeline only
 * calls it): every request once when it closes, and each answer that opened an event stream.
 */
export interface RequestObserver {
  closed(req: IncomingMessage, rec: AccessRecord, seconds: number): void;
  /** The upstream answered with `contentType`; an event stream is counted open until `res` closes. */
  answering(res: ServerResponse, contentType: string | string[] | undefined): void;
}

export type RouteHandler = (req: IncomingMessage, res: ServerResponse, rec: AccessRecord) => Promise<void>;

/**
 * Replaces the loopback Host and Origin checks for requests that do not arrive on the
 * listener itself (the cli-proxy's intercepted tunnels, whose Host is the SaaS's name).
 */
export interface FrontChecks {
  hostCheck: (req: IncomingMessage) => Check;
  /** The answer's message when hostCheck refuses (code forbidden_host). */
  hostRefusal: string;
}

/**
 * The shared front of every loopback server (forwarder and cli-proxy): request id,
 * in-flight tracking for graceful shutdown, loopback Host/Origin
 * checks before any routing, one access-log line, and the one place where any error
 * becomes its JSON answer.
 */
export function createRequestPipeline(deps: PipelineDeps, route: RouteHandler, front?: FrontChecks): (req: IncomingMessage, res: ServerResponse) => void {
  const { log } = deps;
  const access = accessLogFor(log);
  /**
   * Who may be served, then the limits, then Host and Origin, then the route: the same
   * order on both paths below. Synchronous where every answer is known (no microtask turn,
   * no promise of its own), waiting only where the connection's peer is still being asked.
   */
  const admitted = (req: IncomingMessage, res: ServerResponse, rec: AccessRecord, allowed: boolean, uid: number | undefined): Promise<void> | undefined => {
    if (uid !== undefined) rec.peerUid = uid;
    const admission = deps.admit?.(req, res);
    return admission instanceof Promise ? admission.then((gate) => checked(req, res, rec, allowed, gate)) : checked(req, res, rec, allowed, admission);
  };
  const checked = (req: IncomingMessage, res: ServerResponse, rec: AccessRecord, allowed: boolean, gate: Admission): Promise<void> | undefined => {
    if (gate === 'answered') {
      rec.outcome = 'connection_refused';
      res.destroy();
      return undefined;
    }
    if (!allowed) {
      res.shouldKeepAlive = false;
      throw new AppError('forbidden_peer');
    }
    if (gate) throw gate;
    if (front) {
      const host = front.hostCheck(req);
      if (!host.ok) {
        rec.refused = host.reason;
        throw new AppError('forbidden_host', front.hostRefusal);
      }
      return route(req, res, rec);
    }
    // The reason goes into the access line (the operator's), never into the answer.
    const host = checkHost(req.headers.host, deps.sidePort?.(req.socket) ?? deps.port());
    if (!host.ok) {
      rec.refused = host.reason;
      throw new AppError('forbidden_host');
    }
    const origin = checkOrigin(firstValue(req.headers.origin));
    if (!origin.ok) {
      rec.refused = origin.reason;
      throw new AppError('forbidden_origin');
    }
    // Returned, not awaited: a stream can stay open for hours, and a suspended frame here
    // would hold the request's state for as long (docs/performance.md, idle streams).
    return route(req, res, rec);
  };
  /** The first request of a connection whose peer is still being asked. */
  const waitForPeer = async (req: IncomingMessage, res: ServerResponse, rec: AccessRecord): Promise<void> => {
    const allowed = deps.peerAllowed ? await deps.peerAllowed(req) : true;
    // Whose call this is, for the access line and the metrics' per-agent share of tool labels.
    const uid = deps.peerUid ? await deps.peerUid(req) : undefined;
    return admitted(req, res, rec, allowed, uid);
  };
  const start = (req: IncomingMessage, res: ServerResponse, rec: AccessRecord): Promise<void> | undefined => {
    if (deps.stopping()) {
      res.shouldKeepAlive = false;
      throw new AppError('service_unavailable');
    }
    if (deps.peerAllowed || deps.peerUid) {
      const known = deps.peerKnown?.(req);
      return known ? admitted(req, res, rec, known.allowed, known.uid) : waitForPeer(req, res, rec);
    }
    return admitted(req, res, rec, true, undefined);
  };
  const fail = (req: IncomingMessage, res: ServerResponse, rec: AccessRecord, err: unknown): void => {
    if (err instanceof ClientGoneError) {
      rec.outcome = 'client_closed';
      res.destroy();
      return;
    }
    const appErr = toAppError(err);
    if (appErr.code === 'internal_error') {
      log.error({ reqId: rec.reqId, err: { name: (err as Error)?.name, message: (err as Error)?.message } }, 'internal error');
    }
    rec.outcome = appErr.code;
    sendError(res, appErr);
  };
  return (req, res) => {
    // A double, not a bigint: no heap number per request.
    const started = performance.now();
    const rec: AccessRecord = { reqId: requestId(), method: req.method ?? '', bytesIn: 0, bytesOut: 0, outcome: 'ok' };
    // One 'close' listener for the line, the metrics and the in-flight set (left last, as
    // its own listener was: a shutdown's drain sees every finished request logged).
    res.once('close', () => {
      try {
        if (!res.writableFinished && rec.outcome === 'ok') rec.outcome = 'client_closed';
        rec.status = res.statusCode;
        const durationMs = performance.now() - started;
        rec.durationMs = Math.round(durationMs * 1000) / 1000;
        access(rec);
        deps.observer?.closed(req, rec, durationMs / 1000);
      } finally {
        deps.inflight.leave(res);
      }
    });
    deps.inflight.enter(res);
    let pending: Promise<void> | undefined;
    try {
      pending = start(req, res, rec);
    } catch (err) {
      fail(req, res, rec, err);
      return;
    }
    pending?.catch((err: unknown) => fail(req, res, rec, err));
  };
}

/** Answers a small JSON document (health endpoints). */
export function sendJson(res: ServerResponse, status: number, value: unknown, head = false): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store' });
  res.end(head ? undefined : body);
}
