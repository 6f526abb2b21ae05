import { BINDING_ID } from '../registry/schema.js';

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
