import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Agent } from 'undici';
import type { HotFile } from '../config/hot-file.js';
import { AppError, ClientGoneError } from '../errors.js';
import { agentToUpstreamPolicy, filterHeaderRecord, filterRawHeaderList, firstValue, upstreamToAgentPolicy, type HeaderRecord } from '../http/headers.js';
import { readBody } from '../http/request-body.js';
import { tokenNeedles, withoutReflectedToken, type TokenNeedles } from '../http/token-reflection.js';
import { createRequestPipeline, sendJson, type AccessRecord, type PipelineDeps } from '../http/request-pipeline.js';
import { UpstreamCall, upstreamTarget, type UpstreamTarget } from '../http/upstream-call.js';
import { bindingPrefix, type Binding, type InstancesFile } from '../data/registry.js';
import { readTokenFile } from '../token/token-file.js';
import { MAX_TOKEN_RETRIES, waitForRenewedToken, type TokenRotationWait } from '../token/token-wait.js';
import { version } from '../version.js';
import { HEALTH_METHODS, MCP_METHODS, mcpCallOf, route } from './route.js';

export const TOKEN_REJECTED_RETRY_AFTER_S = 10;

export interface ForwarderDeps extends PipelineDeps {
  registry: HotFile<InstancesFile>;
  agent: Agent;
  bodyLimit: number;
  /** Shared by every request of this forwarder: one watch per token file in rotation. */
  rotation: TokenRotationWait;
  tokenWaitMs: number;
}

export function createForwarderHandler(deps: ForwarderDeps): (req: IncomingMessage, res: ServerResponse) => void {
  return createRequestPipeline(deps, (req, res, rec) => handle(deps, req, res, rec));
}

/**
 * What a request needs of its binding beyond the registry entry, derived once per binding
 * object (a reload replaces the objects, so entries never go stale): the upstream target,
 * the access line's binding prefix, and the needles for the token it last used (a token
 * changes at renewal, not per request, and deriving its base64 spellings cost more than the
 * header check itself).
 */
interface BindingState {
  target: UpstreamTarget;
  /** The id it was first served under and its `bindingPrefix` (a registry keeps one object per id). */
  id: string;
  prefix: string;
  needles: TokenNeedles | undefined;
}

const states = new WeakMap<Binding, BindingState>();

function stateOf(binding: Binding, bindingId: string): BindingState {
  let state = states.get(binding);
  if (!state) {
    state = { target: upstreamTarget(new URL(binding.upstreamUrl)), id: bindingId, prefix: bindingPrefix(bindingId), needles: undefined };
    states.set(binding, state);
  }
  return state;
}

function needlesOf(state: BindingState, token: string): TokenNeedles {
  let n = state.needles;
  if (n?.token !== token) {
    n = tokenNeedles(token);
    state.needles = n;
  }
  return n;
}

async function handle(deps: ForwarderDeps, req: IncomingMessage, res: ServerResponse, rec: AccessRecord): Promise<void> {
  const r = route(req.url);
  const method = req.method ?? '';
  if (r.kind === 'health') {
    if (!(HEALTH_METHODS as readonly string[]).includes(method)) {
      throw new AppError('method_not_allowed', undefined, { allow: HEALTH_METHODS.join(', ') });
    }
    const state = deps.registry.current;
    sendJson(res, 200, { status: state.status, instances: Object.keys(state.value).length, version }, method === 'HEAD');
    rec.outcome = 'health';
    return;
  }
  if (r.kind === 'not_found') throw new AppError('not_found');
  if (r.kind === 'unknown_binding') throw new AppError('unknown_binding');

  const bindings = deps.registry.current.value;
  // Own properties only: `constructor` or `__proto__` is a well-formed id, not a binding.
  const binding = Object.hasOwn(bindings, r.bindingId) ? bindings[r.bindingId] : undefined;
  const state = binding && stateOf(binding, r.bindingId);
  rec.binding = state?.id === r.bindingId ? state.prefix : bindingPrefix(r.bindingId);
  if (!(MCP_METHODS as readonly string[]).includes(method)) {
    throw new AppError('method_not_allowed', undefined, { allow: MCP_METHODS.join(', ') });
  }
  if (!binding || !state) throw new AppError('unknown_binding');
  rec.instanceId = binding.instanceId;
  // MCP's GET is the standalone server-to-client stream: it ends only when someone leaves.
  if (method === 'GET') deps.inflight.markStream(res);

  const body = await readBody(req, deps.bodyLimit);
  rec.bytesIn = body.length;
  const mcp = mcpCallOf({ method: firstValue(req.headers['mcp-method']), name: firstValue(req.headers['mcp-name']) }, body);
  rec.mcpMethod = mcp.method;
  if (mcp.tool !== undefined) rec.tool = mcp.tool;
  if (mcp.id !== undefined) rec.rpcId = mcp.id;
  const protocol = firstValue(req.headers['mcp-protocol-version']);
  if (protocol !== undefined && mcp.method === 'tools/call') rec.protocolVersion = protocol.slice(0, 32);

  const read = readTokenFile(binding.tokenFile);
  if (!read.ok) {
    rec.tokenProblem = read.reason;
    throw new AppError('token_unavailable');
  }
  let token = read.token;
  // A flat list, its last value the Authorization header's (set by send, per attempt).
  // Neither name passes the agent's filter: the agent can send neither.
  const baseHeaders = filterRawHeaderList(req.rawHeaders, agentToUpstreamPolicy, 4);
  baseHeaders.push('x-request-id', rec.reqId, 'authorization', '');

  let call = send(deps, state.target, res, method, baseHeaders, body, token);
  let head = await call.head;
  rec.upstreamStatus = head.statusCode;
  if (head.statusCode === 401) {
    // The Gateway honours only a slot's current token: a 401 usually means a renewal has
    // minted a new one that apply has not written yet. Wait for the file to change, then
    // retry with the new token; and again if that one was superseded too before it
    // arrived (renewals faster than the mint → rename window: on a loaded machine in
    // renew-e2e). One bound for the whole wait: only a token that stays rejected is the
    // agent's error.
    const routed = (): boolean => Object.hasOwn(deps.registry.current.value, r.bindingId);
    const deadline = Date.now() + deps.tokenWaitMs;
    let retries = 0;
    while (head.statusCode === 401) {
      await call.discard();
      if (retries === MAX_TOKEN_RETRIES) break;
      const end = await waitForRenewedToken(deps.rotation, binding.tokenFile, token, deadline - Date.now(), res, routed);
      if (res.destroyed) throw new ClientGoneError();
      // A disconnect retires the token file and the binding: answer as a new request would.
      if (end.kind === 'unrouted' || (end.kind === 'deleted' && !routed())) throw new AppError('unknown_binding');
      if (end.kind === 'deleted') {
        rec.tokenProblem = 'missing';
        throw new AppError('token_unavailable');
      }
      if (end.kind !== 'renewed') break;
      retries += 1;
      rec.retried = true;
      rec.retries = retries;
      token = end.token;
      call = send(deps, state.target, res, method, baseHeaders, body, token);
      head = await call.head;
      rec.upstreamStatus = head.statusCode;
    }
    if (head.statusCode === 401) {
      deps.log.warn({ reqId: rec.reqId, instanceId: binding.instanceId }, 'upstream rejected the token (401); renewal may be failing');
      throw new AppError('token_rejected', undefined, { 'retry-after': String(TOKEN_REJECTED_RETRY_AFTER_S) });
    }
  }

  deps.observer?.answering(res, head.headers['content-type']);
  const headers = withoutReflectedToken(filterHeaderRecord(head.headers, upstreamToAgentPolicy), needlesOf(state, token), rec, deps.log);
  // Neither awaited nor returned: a stream can stay open for hours, and a suspended
  // `handle` would hold its whole frame (request headers, token, the upstream's head)
  // meanwhile; returned, this async function's promise would adopt it (a promise and two
  // microtask turns per request). A header Node refuses throws here, as before; the
  // stream's own promise never rejects (UpstreamCall.pipe settles with an outcome).
  streamAnswer(call, head.statusCode, headers, rec);
}

function streamAnswer(call: UpstreamCall, statusCode: number, headers: HeaderRecord, rec: AccessRecord): void {
  void call.pipe(statusCode, headers).then((outcome) => {
    rec.bytesOut = call.bytesOut;
    if (outcome !== 'ok') rec.outcome = outcome;
  });
}

function send(
  deps: ForwarderDeps,
  target: UpstreamTarget,
  res: ServerResponse,
  method: string,
  baseHeaders: string[],
  body: Buffer,
  token: string,
): UpstreamCall {
  // The same list for a retry, its token replaced: undici serialises the headers when
  // the request is dispatched, so an earlier attempt never sees the change.
  baseHeaders[baseHeaders.length - 1] = `Bearer ${token}`;
  return new UpstreamCall(deps.agent, { target, method, headers: baseHeaders, body: body.length > 0 ? body : null }, res);
}

