import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Agent } from 'undici';
import type { HotFile } from '../config/hot-file.js';
import { AppError, sendError, toAppError } from '../errors.js';
import { AbortedError, dispatchUpstream, type UpstreamResponse } from '../http/dispatch.js';
import { agentToUpstreamPolicy, filterHeaderRecord, filterRawHeaders, firstValue, upstreamToAgentPolicy } from '../http/headers.js';
import { checkHost, checkOrigin } from '../http/loopback.js';
import { ClientGoneError, readBody } from '../http/request-body.js';
import { streamResponse } from '../http/respond.js';
import type { InFlight } from '../http/server.js';
import type { Logger } from '../log/logger.js';
import { bindingPrefix, type Binding, type InstancesFile } from '../registry/schema.js';
import { readTokenFile } from '../token/token-file.js';
import { version } from '../version.js';
import { HEALTH_METHODS, MCP_METHODS, mcpMethodOf, route } from './route.js';

export const TOKEN_REJECTED_RETRY_AFTER_S = 10;

export interface ForwarderDeps {
  registry: HotFile<InstancesFile>;
  agent: Agent;
  log: Logger;
  /** The port actually bound (known only after listen when --listen used port 0). */
  port: () => number;
  bodyLimit: number;
  inflight: InFlight;
  stopping: () => boolean;
}

/** What one request did, for its single access-log line. Never a token, never a body. */
interface AccessRecord {
  reqId: string;
  method: string;
  binding?: string;
  instanceId?: string;
  mcpMethod?: string;
  status?: number;
  upstreamStatus?: number;
  bytesIn: number;
  bytesOut: number;
  outcome: string;
  retried?: boolean;
  /** Why no token could be used (missing, empty, unreadable, malformed). */
  tokenProblem?: string;
}

export function createForwarderHandler(deps: ForwarderDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const { log } = deps;

  return (req, res) => {
    const started = process.hrtime.bigint();
    const rec: AccessRecord = { reqId: randomUUID(), method: req.method ?? '', bytesIn: 0, bytesOut: 0, outcome: 'ok' };
    const controller = new AbortController();
    res.once('close', () => {
      if (!res.writableFinished) {
        controller.abort();
        if (rec.outcome === 'ok') rec.outcome = 'client_closed';
      }
      rec.status = res.statusCode;
      const durationMs = Number(process.hrtime.bigint() - started) / 1e6;
      log.info({ ...rec, durationMs: Math.round(durationMs * 1000) / 1000 }, 'access');
    });
    deps.inflight.add(res, () => controller.abort());

    handle(deps, req, res, rec, controller.signal).catch((err: unknown) => {
      if (err instanceof AbortedError || err instanceof ClientGoneError) {
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
    });
  };
}

async function handle(
  deps: ForwarderDeps,
  req: IncomingMessage,
  res: ServerResponse,
  rec: AccessRecord,
  signal: AbortSignal,
): Promise<void> {
  if (deps.stopping()) {
    res.shouldKeepAlive = false;
    throw new AppError('service_unavailable');
  }
  const host = checkHost(req.headers.host, deps.port());
  if (!host.ok) throw new AppError('forbidden_host');
  const origin = checkOrigin(firstValue(req.headers.origin));
  if (!origin.ok) throw new AppError('forbidden_origin');

  const r = route(req.url);
  const method = req.method ?? '';
  if (r.kind === 'health') {
    if (!(HEALTH_METHODS as readonly string[]).includes(method)) {
      throw new AppError('method_not_allowed', undefined, { allow: HEALTH_METHODS.join(', ') });
    }
    const state = deps.registry.current;
    const body = JSON.stringify({ status: state.status, instances: Object.keys(state.value).length, version });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store' });
    res.end(method === 'HEAD' ? undefined : body);
    rec.outcome = 'health';
    return;
  }
  if (r.kind === 'not_found') throw new AppError('not_found');
  if (r.kind === 'unknown_binding') throw new AppError('unknown_binding');

  rec.binding = bindingPrefix(r.bindingId);
  if (!(MCP_METHODS as readonly string[]).includes(method)) {
    throw new AppError('method_not_allowed', undefined, { allow: MCP_METHODS.join(', ') });
  }
  const bindings = deps.registry.current.value;
  // Own properties only: `constructor` or `__proto__` is a well-formed id, not a binding.
  const binding = Object.hasOwn(bindings, r.bindingId) ? bindings[r.bindingId] : undefined;
  if (!binding) throw new AppError('unknown_binding');
  rec.instanceId = binding.instanceId;

  const body = await readBody(req, deps.bodyLimit);
  rec.bytesIn = body.length;
  rec.mcpMethod = mcpMethodOf(firstValue(req.headers['mcp-method']), body);

  const read = readTokenFile(binding.tokenFile);
  if (!read.ok) {
    rec.tokenProblem = read.reason;
    throw new AppError('token_unavailable');
  }
  const token = read.token;
  const baseHeaders = filterRawHeaders(req.rawHeaders, agentToUpstreamPolicy);
  baseHeaders['x-request-id'] = rec.reqId;

  let upstream = await send(deps, binding, method, baseHeaders, body, token, signal);
  rec.upstreamStatus = upstream.statusCode;
  if (upstream.statusCode === 401) {
    await upstream.body.dump().catch(() => undefined);
    // Only renewal can fix a rejected token. If it already did (the file changed while
    // the request was in flight), one retry with the new token saves the agent an error.
    const again = readTokenFile(binding.tokenFile);
    if (again.ok && again.token !== token) {
      rec.retried = true;
      upstream = await send(deps, binding, method, baseHeaders, body, again.token, signal);
      rec.upstreamStatus = upstream.statusCode;
    }
    if (upstream.statusCode === 401) {
      await upstream.body.dump().catch(() => undefined);
      deps.log.warn(
        { reqId: rec.reqId, instanceId: binding.instanceId },
        'upstream rejected the token (401); renewal may be failing',
      );
      throw new AppError('token_rejected', undefined, { 'retry-after': String(TOKEN_REJECTED_RETRY_AFTER_S) });
    }
  }

  const headers = filterHeaderRecord(upstream.headers, upstreamToAgentPolicy);
  const outcome = await streamResponse(res, upstream, headers, (n) => {
    rec.bytesOut += n;
  });
  if (outcome !== 'ok') rec.outcome = outcome;
}

function send(
  deps: ForwarderDeps,
  binding: Binding,
  method: string,
  baseHeaders: Record<string, string | string[]>,
  body: Buffer,
  token: string,
  signal: AbortSignal,
): Promise<UpstreamResponse> {
  return dispatchUpstream(deps.agent, {
    url: new URL(binding.upstreamUrl),
    method,
    headers: { ...baseHeaders, authorization: `Bearer ${token}` },
    body: body.length > 0 ? body : null,
    signal,
  });
}
