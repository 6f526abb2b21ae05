import type { IncomingMessage, ServerResponse } from 'node:http';
import { Transform, type TransformCallback } from 'node:stream';
import type { Agent } from 'undici';
import type { HotFile } from '../config/hot-file.js';
import { AppError } from '../errors.js';
import { dropHeaderRecord, dropRawHeaders, firstValue } from '../http/headers.js';
import { createRequestPipeline, sendJson, type AccessRecord, type PipelineDeps } from '../http/request-pipeline.js';
import { UpstreamCall, upstreamTarget, type UpstreamHead } from '../http/upstream-call.js';
import { readTokenFile } from '../token/token-file.js';
import { version } from '../version.js';
import type { Catalog } from '../data/catalog.js';
import { injectToken, strippedHeaders, withoutQueryParam } from './inject.js';
import { rewriteLocation, routeCli, upstreamUrl } from './route.js';

export interface CliProxyDeps extends PipelineDeps {
  catalog: HotFile<Catalog>;
  agent: Agent;
  bodyLimit: number;
}

/** Upstream → CLI: a session cookie would be a credential the agent could keep. */
const RESPONSE_DROP: ReadonlySet<string> = new Set(['set-cookie', 'set-cookie2']);
const REFUSED_METHODS = new Set(['CONNECT', 'TRACE']);
const ALLOWED_METHODS = 'GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS';

export function createCliProxyHandler(deps: CliProxyDeps): (req: IncomingMessage, res: ServerResponse) => void {
  return createRequestPipeline(deps, (req, res, rec) => handle(deps, req, res, rec));
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

async function handle(deps: CliProxyDeps, req: IncomingMessage, res: ServerResponse, rec: AccessRecord): Promise<void> {
  const r = routeCli(req.url);
  const method = req.method ?? '';
  if (r.kind === 'health') {
    if (method !== 'GET' && method !== 'HEAD') throw new AppError('method_not_allowed', undefined, { allow: 'GET, HEAD' });
    const state = deps.catalog.current;
    sendJson(res, 200, { status: state.status, providers: Object.keys(state.value).length, version }, method === 'HEAD');
    rec.outcome = 'health';
    return;
  }
  if (r.kind === 'not_found') throw new AppError('not_found');
  if (r.kind === 'unknown_provider') throw new AppError('unknown_provider');
  rec.provider = r.provider;
  const providers = deps.catalog.current.value;
  const provider = Object.hasOwn(providers, r.provider) ? providers[r.provider] : undefined;
  if (!provider) throw new AppError('unknown_provider');
  if (REFUSED_METHODS.has(method)) throw new AppError('method_not_allowed', undefined, { allow: ALLOWED_METHODS });

  const url = upstreamUrl(provider.upstream, r.rest, r.search);
  const basePath = new URL(provider.upstream).pathname.replace(/\/+$/, '');
  // `..` out of the base path, or into a sibling of it (`/base-admin` next to `/base`).
  if (basePath && url.pathname !== basePath && !url.pathname.startsWith(`${basePath}/`)) throw new AppError('not_found');
  rec.path = url.pathname.slice(basePath.length, basePath.length + 200) || '/';

  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > deps.bodyLimit) throw new AppError('payload_too_large');

  const read = readTokenFile(provider.tokenFile);
  if (!read.ok) {
    rec.tokenProblem = read.reason;
    throw new AppError('token_unavailable');
  }
  const headers = dropRawHeaders(req.rawHeaders, strippedHeaders(provider.inject));
  injectToken(provider.inject, read.token, headers, url);

  const hasBody = declared !== undefined ? Number(declared) > 0 : req.headers['transfer-encoding'] !== undefined;
  const limiter = hasBody ? new BodyLimit(deps.bodyLimit) : undefined;
  if (limiter) req.pipe(limiter);
  const call = new UpstreamCall(deps.agent, { target: upstreamTarget(url), method, headers, body: limiter ?? null }, res);
  let upstream: UpstreamHead;
  try {
    upstream = await call.head;
  } catch (err) {
    if (limiter?.exceeded) throw new AppError('payload_too_large');
    throw err;
  }
  rec.bytesIn = limiter?.seen ?? 0;
  rec.upstreamStatus = upstream.statusCode;

  const out = dropHeaderRecord(upstream.headers, RESPONSE_DROP);
  const location = firstValue(out.location);
  if (location !== undefined) {
    let rewritten = rewriteLocation(location, url, provider.upstream, `http://${req.headers.host ?? ''}/p/${r.provider}`);
    // An upstream may echo the query it received: never hand the injected token back.
    if (provider.inject.type === 'query') rewritten = withoutQueryParam(rewritten, provider.inject.name);
    if (rewritten.includes(read.token) || rewritten.includes(encodeURIComponent(read.token))) {
      throw new AppError('upstream_unreachable'); // cannot be made safe; refuse rather than leak
    }
    out.location = rewritten;
  }
  const outcome = await call.pipe(upstream.statusCode, out);
  rec.bytesOut = call.bytesOut;
  if (outcome !== 'ok') rec.outcome = outcome;
}
