import { BINDING_ID } from '../data/registry.js';

export type Route =
  | { kind: 'health' }
  | { kind: 'mcp'; bindingId: string }
  | { kind: 'unknown_binding' }
  | { kind: 'not_found' };

export const MCP_METHODS = ['POST', 'GET', 'DELETE'] as const;
export const HEALTH_METHODS = ['GET', 'HEAD'] as const;

const MCP_PATH = /^\/i\/([^/]+)\/mcp$/;

/**
 * Maps a request target to a route. The query string is ignored for routing and is not
 * forwarded: the upstream URL in the registry is the whole truth about where traffic goes.
 */
export function route(target: string | undefined): Route {
  if (!target?.startsWith('/')) return { kind: 'not_found' };
  const q = target.indexOf('?');
  const path = q === -1 ? target : target.slice(0, q);
  if (path === '/healthz') return { kind: 'health' };
  const m = MCP_PATH.exec(path);
  if (!m?.[1]) return { kind: 'not_found' };
  return BINDING_ID.test(m[1]) ? { kind: 'mcp', bindingId: m[1] } : { kind: 'unknown_binding' };
}

/** What the access line says about an MCP message: never an argument value. */
export interface McpCall {
  method?: string;
  /** tools/call only: the tool's name (Mcp-Name header, else params.name), capped. */
  tool?: string;
  /** tools/call only: the JSON-RPC id, to match the line with the agent's own logs. */
  id?: string | number;
}

const MAX_PARSED_BODY = 64 * 1024;
const MAX_TOOL_NAME = 128;
const MAX_ID = 64;

/** The JSON-RPC method of a request, for the access log only: header first, body second. */
export function mcpMethodOf(header: string | undefined, body: Buffer): string | undefined {
  return mcpCallOf({ method: header }, body).method;
}

/**
 * The method of a message, and for a tools/call its tool and id. Only a tools/call is
 * parsed whole (the tool name sits inside params, in any key order); every other message
 * is named off its head, as cheaply as before.
 */
export function mcpCallOf(headers: { method?: string | undefined; name?: string | undefined }, body: Buffer): McpCall {
  const method = headers.method ? headers.method.slice(0, 64) : methodOfBody(body);
  if (method !== 'tools/call') return method === undefined ? {} : { method };
  const call: McpCall = { method };
  if (headers.name) call.tool = headers.name.slice(0, MAX_TOOL_NAME);
  const msg = body.length > 0 && body.length <= MAX_PARSED_BODY ? parseMessage(body) : undefined;
  if (msg && typeof msg === 'object' && !Array.isArray(msg)) {
    const m = msg as { id?: unknown; params?: { name?: unknown } };
    if (call.tool === undefined && typeof m.params?.name === 'string') call.tool = m.params.name.slice(0, MAX_TOOL_NAME);
    if (typeof m.id === 'number' && Number.isFinite(m.id)) call.id = m.id;
    else if (typeof m.id === 'string') call.id = m.id.slice(0, MAX_ID);
  }
  return call;
}

function parseMessage(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8')) as unknown;
  } catch {
    return undefined; // not JSON: the upstream will say so; the line just has less
  }
}

function methodOfBody(body: Buffer): string | undefined {
  if (body.length === 0 || body.length > MAX_PARSED_BODY) return undefined;
  const fast = methodFromHead(body);
  if (fast !== undefined) return fast;
  const msg = parseMessage(body);
  const first = Array.isArray(msg) ? (msg[0] as unknown) : msg;
  if (first && typeof first === 'object' && 'method' in first && typeof first.method === 'string') {
    const name = first.method.slice(0, 64);
    return Array.isArray(msg) && msg.length > 1 ? `batch:${name}` : name;
  }
  if (first && typeof first === 'object' && 'result' in first) return 'response';
  return undefined;
}

/**
 * `{"jsonrpc":"2.0","id":1,"method":"tools/call",…}`, the shape every client sends: the
 * method read off the head of the message. Parsing a 1 KB body on every request only to
 * name its method costs a few µs plus the garbage of the parsed tree (docs/performance.md).
 * For a well-formed message the answer is the one parsing gives: nothing before the match
 * can hold a key named method, and a raw `"method"` later would be a repeated key (which
 * JSON.parse resolves to the last), so then, or when the head has another shape, the
 * message is parsed. (A malformed message whose head names a method is logged with that
 * method; the upstream rejects it.)
 */
const HEAD = /^\s*\{\s*(?:"(?:jsonrpc|id)"\s*:\s*(?:"[^"\\]*"|-?\d+)\s*,\s*){0,2}"method"\s*:\s*"([\x20\x21\x23-\x5b\x5d-\x7e]{1,64})"/;
const METHOD_KEY = Buffer.from('"method"');

function methodFromHead(body: Buffer): string | undefined {
  const m = HEAD.exec(body.toString('latin1', 0, Math.min(body.length, 200)));
  if (!m?.[1]) return undefined;
  if (body.indexOf(METHOD_KEY, m[0].length) !== -1) return undefined;
  return m[1];
}
