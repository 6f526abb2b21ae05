import { errorCodes } from '../errors.js';

/**
 * Label values come from fixed sets, or are capped: a series is created per distinct
 * label set and never freed, so a value a client controls (a method, a tool name) must not
 * be able to grow the process without bound. Nothing here ever holds a path, a query
 * string, a header value or an argument.
 */

export const OTHER = '_OTHER';

export const ROUTES = ['mcp', 'provider', 'healthz', 'other'] as const;
export type RouteLabel = (typeof ROUTES)[number];

/** The route of a request target: which of the parts' fixed routes it asked for. */
export function routeOf(target: string | undefined): RouteLabel {
  return ROUTES[routeIndexOf(target)];
}

/** `routeOf` as its index in ROUTES. */
export function routeIndexOf(target: string | undefined): 0 | 1 | 2 | 3 {
  if (!target) return 3;
  if (target.startsWith('/i/')) return 0;
  if (target.startsWith('/p/')) return 1;
  if (target === '/healthz' || target.startsWith('/healthz?')) return 2;
  return 3;
}

// OpenTelemetry's http.request.method: the known methods, anything else `_OTHER`.
const METHODS: ReadonlySet<string> = new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH']);

export const METHOD_COUNT = METHODS.size;

export function methodLabel(method: string): string {
  return METHODS.has(method) ? method : OTHER;
}

/** An HTTP status as a number for a series key: the status itself, 0 for anything not one. */
export function statusCodeOf(status: number | undefined): number {
  return status !== undefined && Number.isInteger(status) && status >= 100 && status <= 599 ? status : 0;
}

export function statusLabel(status: number | undefined): string {
  const code = statusCodeOf(status);
  return code === 0 ? OTHER : String(code);
}

const ERROR_TYPES: ReadonlySet<string> = new Set<string>([...errorCodes, 'client_closed', 'upstream_failed', 'connection_refused']);

/**
 * OpenTelemetry's error.type: empty when the call succeeded, else the stable error code of
 * src/errors.ts (or how a stream ended early). An upstream's own 4xx/5xx passes through as
 * a success of ours; its status code says the rest.
 */
export function errorTypeOf(outcome: string): string | undefined {
  if (outcome === 'ok' || outcome === 'health') return undefined;
  return ERROR_TYPES.has(outcome) ? outcome : OTHER;
}

// The methods of the MCP specification (2025-06-18, plus tasks); a batch, a response or
// anything else a client invents is `_OTHER`.
const MCP_METHODS: ReadonlySet<string> = new Set([
  'initialize',
  'ping',
  'tools/list',
  'tools/call',
  'resources/list',
  'resources/read',
  'resources/templates/list',
  'resources/subscribe',
  'resources/unsubscribe',
  'prompts/list',
  'prompts/get',
  'completion/complete',
  'logging/setLevel',
  'sampling/createMessage',
  'elicitation/create',
  'roots/list',
  'tasks/get',
  'tasks/list',
  'tasks/result',
  'tasks/cancel',
  'notifications/initialized',
  'notifications/cancelled',
  'notifications/progress',
  'notifications/roots/list_changed',
  'notifications/message',
]);

export const MCP_METHOD_COUNT = MCP_METHODS.size;

export function mcpMethodLabel(method: string): string {
  return MCP_METHODS.has(method) ? method : OTHER;
}

export const TOKEN_FAILURE_REASONS = ['missing', 'empty', 'unreadable', 'malformed'] as const;

export function tokenReasonLabel(reason: string): string {
  return (TOKEN_FAILURE_REASONS as readonly string[]).includes(reason) ? reason : OTHER;
}

export const MAX_LABEL_LENGTH = 64;
export const MAX_DISTINCT = 100;
// MCP's tool name alphabet (and `:` of slot names); any other value is not one we label a series with.
const NAME = /^[A-Za-z0-9_.:\-/]+$/;

/** The distinct values one owner (an agent's UID) may add: a quarter of the table. */
export const MAX_PER_OWNER = MAX_DISTINCT / 4;

/**
 * A label value a client or the platform chooses (a tool name, a slot): kept as sent,
 * capped in length, for the first `max` distinct values; every later one is `_other`, so a
 * flood of invented names adds one series, not one per name. Values an agent sends are
 * added under its UID, `maxPerOwner` each: one agent inventing names fills its own share
 * and sees `_other`, and the others' tools keep their names (issue 21, item 7). A value
 * anyone added is kept for everyone.
 */
export class CappedLabel {
  private readonly seen = new Set<string>();
  private readonly added = new Map<number, number>();

  constructor(
    private readonly max = MAX_DISTINCT,
    private readonly maxLength = MAX_LABEL_LENGTH,
    private readonly maxPerOwner = max,
  ) {}

  /**
   * `owner`: who sent the value (an agent's UID); undefined: the platform, or a peer whose
   * UID is not read (no peer check: then nobody can be told apart and only `max` holds).
   */
  of(value: string, owner?: number): string {
    const v = value.slice(0, this.maxLength);
    if (this.seen.has(v)) return v;
    if (!NAME.test(v)) return '_invalid';
    if (this.seen.size >= this.max) return '_other';
    if (owner === undefined) {
      this.seen.add(v);
      return v;
    }
    const added = this.added.get(owner) ?? 0;
    if (added >= this.maxPerOwner) return '_other';
    this.added.set(owner, added + 1);
    this.seen.add(v);
    return v;
  }
}

/**
 * Each label value a small number, fixed at its first sight, for a numeric series key
 * (src/metrics/hot-histogram.ts): a lookup of a value seen before hashes at most that
 * string. Bounded by its callers, which index values of fixed or capped sets only.
 */
export class LabelIndex {
  private readonly index = new Map<string, number>();
  private readonly values: string[] = [];

  of(value: string): number {
    let i = this.index.get(value);
    if (i === undefined) {
      i = this.values.length;
      this.index.set(value, i);
      this.values.push(value);
    }
    return i;
  }
}
