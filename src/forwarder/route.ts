import { BINDING_ID } from '../data/registry.js';

/** Shared between the requests to one URL (route keeps its last answer): read, never changed. */
export type Route =
  | { readonly kind: 'health' }
  | { readonly kind: 'mcp'; readonly bindingId: string }
  | { readonly kind: 'unknown_binding' }
  | { readonly kind: 'not_found' };

export const MCP_METHODS = ['POST', 'GET', 'DELETE'] as const;
export const HEALTH_METHODS = ['GET', 'HEAD'] as const;

const MCP_PATH = /^\/i\/([^/]+)\/mcp$/;

/**
 * Maps a request target to a route. The query string is ignored for routing and is not
 * forwarded: the upstream URL in the registry is the whole truth about where traffic goes.
 */
export function route(target: string | undefined): Route {
  // An agent sends every call to the same URL: the last answer, kept (routes are never
  // changed by their users), spares the match, its array and a new route per request.
  if (target === lastTarget && lastRoute !== undefined) return lastRoute;
  const r = routeOf(target);
  lastTarget = target;
  lastRoute = r;
  return r;
}

let lastTarget: string | undefined;
let lastRoute: Route | undefined;

function routeOf(target: string | undefined): Route {
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
 * read for more (the tool name sits inside params, in any key order; the SDK puts the id
 * last); every other message is named off its head, as cheaply as before.
 */
export function mcpCallOf(headers: { method?: string | undefined; name?: string | undefined }, body: Buffer): McpCall {
  const method = headers.method ? headers.method.slice(0, 64) : methodOfBody(body);
  if (method !== 'tools/call') return method === undefined ? {} : { method };
  const call: McpCall = { method };
  if (headers.name) call.tool = headers.name.slice(0, MAX_TOOL_NAME);
  if (body.length === 0 || body.length > MAX_PARSED_BODY) return call;
  const found = callDetail(body);
  if (call.tool === undefined && found.tool !== undefined) call.tool = found.tool.slice(0, MAX_TOOL_NAME);
  if (found.id !== undefined) call.id = typeof found.id === 'string' ? found.id.slice(0, MAX_ID) : found.id;
  return call;
}

/** A tools/call's `params.name` and `id`, as JSON.parse would give them (uncapped). */
interface CallDetail {
  tool?: string | undefined;
  id?: string | number | undefined;
}

/**
 * Scanned when it can be, parsed when only parsing can say (an escape in a key or in a
 * value we keep). Parsing the whole message cost a 1 KB string, its tree and the
 * argument strings per call, for two short values (docs/performance.md).
 */
function callDetail(body: Buffer): CallDetail {
  const scanned = scanCall(body);
  if (scanned !== PARSE) return scanned;
  const msg = parseMessage(body);
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return {};
  const m = msg as { id?: unknown; params?: { name?: unknown } };
  return {
    tool: typeof m.params?.name === 'string' ? m.params.name : undefined,
    id: (typeof m.id === 'number' && Number.isFinite(m.id)) || typeof m.id === 'string' ? m.id : undefined,
  };
}

function parseMessage(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8')) as unknown;
  } catch {
    return undefined; // not JSON: the upstream will say so; the line just has less
  }
}

const PARSE = Symbol('parse');
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const COMMA = 0x2c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const KEY_ID = Buffer.from('id');
const KEY_PARAMS = Buffer.from('params');
const KEY_NAME = Buffer.from('name');
const JSON_NUMBER = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;

/**
 * One pass over a top-level object: its `id`, and `name` of its `params` object; other
 * values are skipped (a string by a search for its closing quote). A repeated key counts
 * by its last value, as in JSON.parse; an object that does not close, or is followed by
 * anything but whitespace, gives nothing, as a failed parse does. It checks structure, not
 * every token: a malformed message whose structure holds may still be named (the upstream
 * rejects it), as the method off the head already is.
 */
function scanCall(b: Buffer): CallDetail | typeof PARSE {
  const detail: CallDetail = {};
  let i = skipSpace(b, 0);
  if (b[i] !== OPEN_OBJECT) return {}; // an array (a batch) or a scalar: no call to name
  i = skipSpace(b, i + 1);
  if (b[i] === CLOSE_OBJECT) return afterObject(b, i, detail);
  for (;;) {
    const key = i;
    const keyEnd = stringEnd(b, i);
    if (keyEnd === -1) return {};
    if (!isPlain(b, key, keyEnd)) return PARSE;
    i = skipSpace(b, keyEnd);
    if (b[i] !== COLON) return {};
    i = skipSpace(b, i + 1);
    if (isKey(b, key, keyEnd, KEY_ID)) {
      const end = valueEnd(b, i);
      if (end === -1) return {};
      if (b[i] === QUOTE) {
        const id = plainString(b, i, end);
        if (id === PARSE) return PARSE;
        detail.id = id;
      } else {
        const text = b.toString('latin1', i, end);
        const n = JSON_NUMBER.test(text) ? Number(text) : NaN;
        detail.id = Number.isFinite(n) ? n : undefined;
      }
      i = end;
    } else if (isKey(b, key, keyEnd, KEY_PARAMS)) {
      detail.tool = undefined;
      if (b[i] === OPEN_OBJECT) {
        const end = scanParams(b, i, detail);
        if (end === PARSE) return PARSE;
        i = end;
      } else i = valueEnd(b, i);
    } else i = valueEnd(b, i);
    if (i === -1) return {};
    i = skipSpace(b, i);
    if (b[i] === CLOSE_OBJECT) return afterObject(b, i, detail);
    if (b[i] !== COMMA) return {};
    i = skipSpace(b, i + 1);
  }
}

/** The params object at `i`: its `name` into `detail.tool`; the index after it, or -1. */
function scanParams(b: Buffer, i: number, detail: CallDetail): number | typeof PARSE {
  i = skipSpace(b, i + 1);
  if (b[i] === CLOSE_OBJECT) return i + 1;
  for (;;) {
    const key = i;
    const keyEnd = stringEnd(b, i);
    if (keyEnd === -1) return -1;
    if (!isPlain(b, key, keyEnd)) return PARSE;
    i = skipSpace(b, keyEnd);
    if (b[i] !== COLON) return -1;
    i = skipSpace(b, i + 1);
    const end = valueEnd(b, i);
    if (end === -1) return -1;
    if (isKey(b, key, keyEnd, KEY_NAME)) {
      if (b[i] === QUOTE) {
        const name = plainString(b, i, end);
        if (name === PARSE) return PARSE;
        detail.tool = name;
      } else detail.tool = undefined;
    }
    i = skipSpace(b, end);
    if (b[i] === CLOSE_OBJECT) return i + 1;
    if (b[i] !== COMMA) return -1;
    i = skipSpace(b, i + 1);
  }
}

function afterObject(b: Buffer, close: number, detail: CallDetail): CallDetail {
  return skipSpace(b, close + 1) === b.length ? detail : {};
}

function skipSpace(b: Buffer, i: number): number {
  while (i < b.length) {
    const c = b[i];
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return i;
    i++;
  }
  return i;
}

/** Whether the key string `b[start, end)` (quotes included) is `name`. */
function isKey(b: Buffer, start: number, end: number, name: Buffer): boolean {
  return end - start === name.length + 2 && b.compare(name, 0, name.length, start + 1, end - 1) === 0;
}

/** The index after the string opening at `i` (its closing quote is one not escaped), or -1. */
function stringEnd(b: Buffer, i: number): number {
  if (b[i] !== QUOTE) return -1;
  let from = i + 1;
  for (;;) {
    const q = b.indexOf(QUOTE, from);
    if (q === -1) return -1;
    let k = q - 1;
    while (b[k] === BACKSLASH) k--;
    if ((q - 1 - k) % 2 === 0) return q + 1;
    from = q + 1;
  }
}

/** The index after the value starting at `i`, or -1 when it does not end. */
function valueEnd(b: Buffer, i: number): number {
  const c = b[i];
  if (c === QUOTE) return stringEnd(b, i);
  if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
    let depth = 0;
    while (i < b.length) {
      const d = b[i];
      if (d === QUOTE) {
        i = stringEnd(b, i);
        if (i === -1) return -1;
        continue;
      }
      if (d === OPEN_OBJECT || d === OPEN_ARRAY) depth++;
      else if ((d === CLOSE_OBJECT || d === CLOSE_ARRAY) && --depth === 0) return i + 1;
      i++;
    }
    return -1;
  }
  // A number, true, false or null: up to the next delimiter.
  let j = i;
  while (j < b.length) {
    const d = b[j] as number;
    if (d === COMMA || d === CLOSE_OBJECT || d === CLOSE_ARRAY || d === 0x20 || d === 0x0a || d === 0x0d || d === 0x09) break;
    j++;
  }
  return j > i ? j : -1;
}

/** Whether the string `b[start, end)` (quotes included) reads as its bytes: no escape, no control character. */
function isPlain(b: Buffer, start: number, end: number): boolean {
  for (let k = start + 1; k < end - 1; k++) {
    const c = b[k] as number;
    if (c === BACKSLASH || c < 0x20) return false;
  }
  return true;
}

/** The string `b[start, end)` (quotes included), or PARSE when only parsing can decode it. */
function plainString(b: Buffer, start: number, end: number): string | typeof PARSE {
  return isPlain(b, start, end) ? b.toString('utf8', start + 1, end - 1) : PARSE;
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
