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

/** The JSON-RPC method of a request, for the access log only: header first, body second. */
export function mcpMethodOf(header: string | undefined, body: Buffer): string | undefined {
  if (header) return header.slice(0, 64);
  if (body.length === 0 || body.length > 64 * 1024) return undefined;
  const fast = methodFromHead(body);
  if (fast !== undefined) return fast;
  try {
    const msg = JSON.parse(body.toString('utf8')) as unknown;
    const first = Array.isArray(msg) ? (msg[0] as unknown) : msg;
    if (first && typeof first === 'object' && 'method' in first && typeof first.method === 'string') {
      const name = first.method.slice(0, 64);
      return Array.isArray(msg) && msg.length > 1 ? `batch:${name}` : name;
    }
    if (first && typeof first === 'object' && 'result' in first) return 'response';
  } catch {
    // Not JSON: the upstream will say so; the log just has no method.
  }
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
