import type { IncomingMessage, ServerResponse } from 'node:http';
import { Transform, type TransformCallback } from 'node:stream';
import type { Agent } from 'undici';
import type { HotFile } from '../config/hot-file.js';
import { AppError, ClientGoneError } from '../errors.js';
import { cliUpstreamToAgentPolicy, dropRawHeaders, filterResponseRecord, firstValue, type HeaderRecord } from '../http/headers.js';
import { holdsToken, tokenNeedles, withoutReflectedToken, type TokenNeedles } from '../http/token-reflection.js';
import { createRequestPipeline, sendJson, type AccessRecord, type FrontChecks, type PipelineDeps } from '../http/request-pipeline.js';
import { UpstreamCall, upstreamTarget, type UpstreamHead } from '../http/upstream-call.js';
import { readBody } from '../http/request-body.js';
import { readTokenFile } from '../token/token-file.js';
import { MAX_TOKEN_RETRIES, waitForRenewedToken, type TokenRotationWait } from '../token/token-wait.js';
import { version } from '../version.js';
import { providerPorts, type Catalog, type Provider } from '../data/catalog.js';
import { tlsProviderFor } from '../data/tls-hosts.js';
import type { Check } from '../http/loopback.js';
import type { AuditSpool } from './audit-spool.js';
import type { AuditEvent } from '../data/audit-event.js';
import { parseAwsCredentials, signAws } from './aws-sigv4.js';
import { basicCredential, injectToken, strippedHeaders, withoutQueryParam } from './inject.js';
import { rewriteLinkHeader, rewriteLocation, routeCli, upstreamUrl } from './route.js';

export interface CliProxyDeps extends PipelineDeps {
  catalog: HotFile<Catalog>;
  agent: Agent;
  /** TLS mode's upstream dispatcher: the system's CAs (+ `--upstream-ca`), `--resolve`. */
  tlsAgent?: Agent | undefined;
  /**
   * Base-url providers' https upstreams, when the test aids are on (`--resolve`,
   * `--upstream-ca`): TLS mode's dispatcher, so a lab serves a base-url CLI's fake under
   * its real https name too. Undefined (no test aid): the guarded `agent`, as always.
   */
  labAgent?: Agent | undefined;
  bodyLimit: number;
  /** Shared by every request: one watch per token file in rotation. */
  rotation: TokenRotationWait;
  tokenWaitMs: number;
  /** With a spool, one audit event per request to a known provider (SPEC §9). */
  audit?: AuditSpool | undefined;
}

/**
 * A body up to this size is buffered so that a request meeting a token rotation can be
 * sent again; a larger or chunked upload streams through and cannot be.
 */
export const REPLAY_LIMIT = 64 * 1024;

const REFUSED_METHODS = new Set(['CONNECT', 'TRACE']);
const ALLOWED_METHODS = 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS';

const STREAMED_NOT_RETRIED =
  'The upstream rejected a token that renewal has since replaced; this request streamed its body, so it cannot be sent again: run the command again.';

/** What one request is for, once routed: a provider and where its call goes. */
export interface ProviderTarget {
  name: string;
  provider: Provider;
  /** The upstream base: the catalog's `upstream`, or `https://<host>` in TLS mode. */
  upstream: string;
  /** The CLI's path and query, raw. */
  rest: string;
  search: string;
  /**
   * Where URLs back into the upstream are sent instead (`/p/<provider>` on the proxy);
   * undefined in TLS mode, where the CLI's next call comes through CONNECT again.
   */
  proxyBase: string | undefined;
}

type Route = (req: IncomingMessage, res: ServerResponse, rec: AccessRecord) => ProviderTarget | 'answered';

/** `/p/<provider>/…` on the loopback listener (SPEC §5). */
export function createCliProxyHandler(deps: CliProxyDeps): (req: IncomingMessage, res: ServerResponse) => void {
  return auditedPipeline(deps, (req, res, rec) => routePath(deps, req, res, rec));
}

/**
 * The requests inside an intercepted CONNECT tunnel (SPEC §10): same pipeline, the
 * provider found by the tunnel's host in the catalog as it is now (a provider gone since
 * the tunnel opened answers 404, never a call without its token).
 */
export function createInterceptHandler(deps: CliProxyDeps, hostOf: (req: IncomingMessage) => string | undefined): (req: IncomingMessage, res: ServerResponse) => void {
  const hostCheck = (req: IncomingMessage): Check => {
    const host = hostOf(req);
    const header = req.headers.host?.toLowerCase();
    return host !== undefined && (header === host || header === `${host}:443`) ? { ok: true } : { ok: false, reason: 'Host is not the tunnel\'s host' };
  };
  return auditedPipeline(
    deps,
    (req, _res, rec) => {
      const host = hostOf(req) as string;
      const found = tlsProviderFor(deps.catalog.current.value, host);
      if (found) rec.provider = found.name;
      if (!found) throw new AppError('unknown_provider');
      const target = req.url ?? '';
      if (!target.startsWith('/')) throw new AppError('not_found');
      const q = target.indexOf('?');
      return {
        name: found.name,
        provider: found.provider,
        upstream: `https://${host}`,
        rest: q === -1 ? target : target.slice(0, q),
        search: q === -1 ? '' : target.slice(q),
        proxyBase: undefined,
      };
    },
    { hostCheck, hostRefusal: 'The Host header must name the host this tunnel was opened to.' },
  );
}

function auditedPipeline(deps: CliProxyDeps, route: Route, checks?: FrontChecks): (req: IncomingMessage, res: ServerResponse) => void {
  const { audit } = deps;
  if (!audit) return createRequestPipeline(deps, (req, res, rec) => handle(deps, req, res, rec, route), checks);
  return createRequestPipeline(
    deps,
    (req, res, rec) => {
      const peer = deps.peerUid?.(req);
      const time = new Date().toISOString();
      const audited: { provider?: string } = {};
      // Registered after the pipeline's own close listener, so status and duration are set.
      res.once('close', () => {
        // A request cut before any answer has no status; 499 as nginx logs it.
        const status = res.headersSent ? res.statusCode : 499;
        if (audited.provider !== undefined) void auditEvent(audited.provider, time, status, rec, peer).then((e) => audit.record(e));
      });
      return handle(deps, req, res, rec, route, audited);
    },
    checks,
  );
}

/** The shape of the call from its access record; `rec.path` never holds the query. */
async function auditEvent(provider: string, time: string, status: number, rec: AccessRecord, peer: Promise<number | undefined> | undefined): Promise<AuditEvent> {
  return {
    id: rec.reqId,
    time,
    provider,
    method: rec.method,
    path: typeof rec.path === 'string' ? rec.path : '/',
    status,
    bytesIn: rec.bytesIn,
    bytesOut: rec.bytesOut,
    durationMs: typeof rec.durationMs === 'number' ? rec.durationMs : 0,
    peerUid: (await peer?.catch(() => undefined)) ?? null,
  };
}

/** Counts request bytes on their way upstream and fails the upload past the limit. */
class BodyLimit extends Transform {
  seen = 0;
  exceeded = false;
  constructor(private readonly limit: number) {
    super();
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.seen += chunk.length;
    if (this.seen > this.limit) {
      this.exceeded = true;
      cb(new AppError('payload_too_large'));
      return;
    }
    cb(null, chunk);
  }
}

function routePath(deps: CliProxyDeps, req: IncomingMessage, res: ServerResponse, rec: AccessRecord): ProviderTarget | 'answered' {
  const port = deps.sidePort?.(req.socket);
  if (port !== undefined) return routePort(deps, req, port, rec);
  const r = routeCli(req.url);
  const method = req.method ?? '';
  if (r.kind === 'health') {
    if (method !== 'GET' && method !== 'HEAD') throw new AppError('method_not_allowed', undefined, { allow: 'GET, HEAD' });
    const state = deps.catalog.current;
    sendJson(res, 200, { status: state.status, providers: Object.keys(state.value).length, version }, method === 'HEAD');
    rec.outcome = 'health';
    return 'answered';
  }
  if (r.kind === 'not_found') throw new AppError('not_found');
  if (r.kind === 'unknown_provider') throw new AppError('unknown_provider');
  rec.provider = r.provider;
  const providers = deps.catalog.current.value;
  const provider = Object.hasOwn(providers, r.provider) ? providers[r.provider] : undefined;
  // A tls provider has no base URL to serve: it is reached through CONNECT only.
  if (!provider || provider.upstream === undefined) throw new AppError('unknown_provider');
  return { name: r.provider, provider, upstream: provider.upstream, rest: r.rest, search: r.search, proxyBase: `http://${req.headers.host ?? ''}/p/${r.provider}` };
}

/** port → provider, once per catalog in force (a reload makes a new object), not per request. */
const portMaps = new WeakMap<Catalog, Map<number, string>>();
function portsOf(catalog: Catalog): Map<number, string> {
  let map = portMaps.get(catalog);
  if (map === undefined) {
    map = providerPorts(catalog);
    portMaps.set(catalog, map);
  }
  return map;
}

/**
 * A provider port: every path is the provider's, with no `/p/<provider>` prefix (for a
 * CLI that drops the base URL's path). The catalog is asked per request, so a port the
 * catalog has dropped answers unknown_provider on a connection still open.
 */
function routePort(deps: CliProxyDeps, req: IncomingMessage, port: number, rec: AccessRecord): ProviderTarget {
  const target = req.url ?? '';
  if (!target.startsWith('/')) throw new AppError('not_found');
  const q = target.indexOf('?');
  const providers = deps.catalog.current.value;
  const name = portsOf(providers).get(port);
  const provider = name === undefined ? undefined : providers[name];
  if (name === undefined || provider?.upstream === undefined) throw new AppError('unknown_provider');
  rec.provider = name;
  return {
    name,
    provider,
    upstream: provider.upstream,
    rest: q === -1 ? target : target.slice(0, q),
    search: q === -1 ? '' : target.slice(q),
    proxyBase: `http://${req.headers.host ?? ''}`,
  };
}

async function handle(deps: CliProxyDeps, req: IncomingMessage, res: ServerResponse, rec: AccessRecord, route: Route, audited?: { provider?: string }): Promise<void> {
  const method = req.method ?? '';
  const routed = route(req, res, rec);
  if (routed === 'answered') return;
  const { provider } = routed;
  if (audited) audited.provider = routed.name;
  if (REFUSED_METHODS.has(method)) throw new AppError('method_not_allowed', undefined, { allow: ALLOWED_METHODS });

  const basePath = new URL(routed.upstream).pathname.replace(/\/+$/, '');
  const target = (): URL => upstreamUrl(routed.upstream, routed.rest, routed.search);
  const first = target();
  // `..` out of the base path, or into a sibling of it (`/base-admin` next to `/base`).
  if (basePath && first.pathname !== basePath && !first.pathname.startsWith(`${basePath}/`)) throw new AppError('not_found');
  rec.path = first.pathname.slice(basePath.length, basePath.length + 200) || '/';

  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > deps.bodyLimit) throw new AppError('payload_too_large');

  const read = readTokenFile(provider.tokenFile);
  if (!read.ok) {
    rec.tokenProblem = read.reason;
    throw new AppError('token_unavailable');
  }
  const aws = provider.inject.type === 'aws-sigv4';
  if (aws && !parseAwsCredentials(read.token)) {
    rec.tokenProblem = 'malformed';
    throw new AppError('token_unavailable');
  }
  const hasBody = declared !== undefined ? Number(declared) > 0 : req.headers['transfer-encoding'] !== undefined;
  // SigV4 hashes the body into the signature unless the CLI named the hash itself (S3's
  // x-amz-content-sha256): then the whole body is read first, up to the body limit.
  const wholeBody = aws && req.headers['x-amz-content-sha256'] === undefined;
  const replayable = !hasBody || wholeBody || (declared !== undefined && Number(declared) <= REPLAY_LIMIT);
  const buffered = hasBody && replayable ? await readBody(req, wholeBody ? deps.bodyLimit : Math.min(REPLAY_LIMIT, deps.bodyLimit)) : undefined;
  const limiter = hasBody && !replayable ? new BodyLimit(deps.bodyLimit) : undefined;
  if (limiter) req.pipe(limiter);

  // Injection writes into the headers and the URL: each attempt starts from fresh ones.
  const send = async (token: string, url: URL): Promise<UpstreamCall> => {
    const headers = dropRawHeaders(req.rawHeaders, strippedHeaders(provider.inject));
    if (aws) {
      const credentials = parseAwsCredentials(token);
      if (!credentials) {
        rec.tokenProblem = 'malformed';
        throw new AppError('token_unavailable');
      }
      await signAws(credentials, method, url, headers, buffered);
    } else injectToken(provider.inject, token, headers, url);
    const dispatcher = routed.proxyBase === undefined ? (deps.tlsAgent ?? deps.agent) : url.protocol === 'https:' && deps.labAgent ? deps.labAgent : deps.agent;
    return new UpstreamCall(dispatcher, { target: upstreamTarget(url), method, headers, body: buffered ?? limiter ?? null }, res);
  };
  const headOf = async (call: UpstreamCall): Promise<UpstreamHead> => {
    try {
      return await call.head;
    } catch (err) {
      if (limiter?.exceeded) throw new AppError('payload_too_large');
      throw err;
    }
  };
  let token = read.token;
  let url = first;
  let call = await send(token, url);
  let upstream = await headOf(call);
  if (upstream.statusCode === 401 && deps.tokenWaitMs > 0) {
    // The SaaS may refuse a token the moment its successor is minted; renewal writes the
    // successor within a second. The 401 is held (not yet relayed) while we wait; and again
    // if the retry's token was itself superseded before it arrived (as in the forwarder).
    // One bound for the whole wait; after it the SaaS's own 401 goes to the CLI.
    const stillRouted = (): boolean => Object.hasOwn(deps.catalog.current.value, routed.name);
    const deadline = Date.now() + deps.tokenWaitMs;
    let retries = 0;
    while (upstream.statusCode === 401 && retries < MAX_TOKEN_RETRIES) {
      const end = await waitForRenewedToken(deps.rotation, provider.tokenFile, token, deadline - Date.now(), res, stillRouted);
      if (res.destroyed) throw new ClientGoneError();
      if (end.kind === 'deleted' || end.kind === 'unrouted') {
        // A disconnect retires the token file and the provider: answer as a new request would.
        await call.discard();
        rec.upstreamStatus = 401;
        if (end.kind === 'unrouted' || !stillRouted()) throw new AppError('unknown_provider');
        rec.tokenProblem = 'missing';
        throw new AppError('token_unavailable');
      }
      if (end.kind !== 'renewed') break;
      await call.discard();
      rec.upstreamStatus = 401;
      if (!replayable) throw new AppError('token_rejected', STREAMED_NOT_RETRIED);
      retries += 1;
      rec.retried = true;
      rec.retries = retries;
      token = end.token;
      url = target();
      call = await send(token, url);
      upstream = await headOf(call);
    }
  }
  rec.bytesIn = buffered?.length ?? limiter?.seen ?? 0;
  rec.upstreamStatus = upstream.statusCode;

  const needles = secretNeedles(provider.inject, token);
  const out = withoutReflectedToken(
    backThroughProxy(filterResponseRecord(upstream.headers, cliUpstreamToAgentPolicy), routed, url, needles),
    needles,
    rec,
    deps.log,
  );
  deps.observer?.answering(res, upstream.headers['content-type']);
  const outcome = await call.pipe(upstream.statusCode, out);
  rec.bytesOut = call.bytesOut;
  if (outcome !== 'ok') rec.outcome = outcome;
}

/** What an answer must not carry: the token; for SigV4 the secret key and session token inside it. */
function secretNeedles(inject: Provider['inject'], token: string): TokenNeedles {
  if (inject.type === 'basic') return tokenNeedles(token, [basicCredential(inject, token)]);
  if (inject.type !== 'aws-sigv4') return tokenNeedles(token);
  const credentials = parseAwsCredentials(token);
  return credentials ? tokenNeedles(credentials.secretAccessKey, credentials.sessionToken !== undefined ? [credentials.sessionToken] : []) : tokenNeedles(token);
}

/**
 * URLs in `Location` and `Link` that point back into the upstream go through the proxy
 * instead (the CLI would otherwise call the upstream with only its placeholder), less the
 * query parameter a `query` inject put there: an upstream may echo the query it got.
 */
function backThroughProxy(out: HeaderRecord, routed: ProviderTarget, url: URL, needles: TokenNeedles): HeaderRecord {
  const inject = routed.provider.inject;
  const { proxyBase } = routed;
  const rewrite = (uri: string): string => {
    if (proxyBase === undefined) return uri;
    const rewritten = rewriteLocation(uri, url, routed.upstream, proxyBase);
    return inject.type === 'query' ? withoutQueryParam(rewritten, inject.name) : rewritten;
  };
  const location = firstValue(out.location);
  if (location !== undefined) {
    const rewritten = rewrite(location);
    // A redirect without its target would be a different answer: refuse rather than leak.
    if (holdsToken(rewritten, needles)) throw new AppError('upstream_unreachable');
    out.location = rewritten;
  }
  const link = out.link;
  if (link !== undefined && proxyBase !== undefined) out.link = Array.isArray(link) ? link.map((v) => rewriteLinkHeader(v, rewrite)) : rewriteLinkHeader(link, rewrite);
  return out;
}
