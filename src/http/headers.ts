/**
 * Header filters as pure functions over Node's raw header list. Whitelists, not
 * blacklists: anything a future agent or Gateway invents is dropped by default.
 */

export type HeaderRecord = Record<string, string | string[]>;

/** Agent → upstream (SPEC §3). `mcp-param-*` is matched as a prefix. */
export const agentToUpstream: ReadonlySet<string> = new Set([
  'accept',
  'content-type',
  'mcp-session-id',
  'mcp-protocol-version',
  'last-event-id',
  'mcp-method',
  'mcp-name',
  'user-agent',
]);

/** Upstream → agent (SPEC §3). Notably not `www-authenticate`: it would start an OAuth flow. */
export const upstreamToAgent: ReadonlySet<string> = new Set([
  'content-type',
  'mcp-session-id',
  'mcp-protocol-version',
  'cache-control',
  'retry-after',
  'content-encoding',
  'content-length',
]);

export interface HeaderPolicy {
  names: ReadonlySet<string>;
  prefixes?: readonly string[];
}

export const agentToUpstreamPolicy: HeaderPolicy = { names: agentToUpstream, prefixes: ['mcp-param-'] };
export const upstreamToAgentPolicy: HeaderPolicy = { names: upstreamToAgent };

function allowed(name: string, policy: HeaderPolicy): boolean {
  if (policy.names.has(name)) return true;
  return policy.prefixes?.some((p) => name.startsWith(p)) ?? false;
}

/**
 * Filters a flat raw header array ([name, value, name, value, ...], as Node's
 * `req.rawHeaders` and undici's raw headers give) into a lower-cased record, keeping
 * repeated headers as arrays so nothing is merged that the peer sent separately.
 */
export function filterRawHeaders(raw: readonly string[], policy: HeaderPolicy): HeaderRecord {
  const out: HeaderRecord = {};
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = (raw[i] as string).toLowerCase();
    if (!allowed(name, policy)) continue;
    appendHeader(out, name, raw[i + 1] as string);
  }
  return out;
}

/** Adds a header, keeping repeats as an array so nothing the peer sent separately is merged. */
function appendHeader(out: HeaderRecord, name: string, value: string): void {
  const prev = out[name];
  if (prev === undefined) out[name] = value;
  else if (Array.isArray(prev)) prev.push(value);
  else out[name] = [prev, value];
}

/** Same filter over an already-parsed record (undici's `headers` object). */
export function filterHeaderRecord(
  headers: Readonly<Record<string, string | string[] | undefined>>,
  policy: HeaderPolicy,
): HeaderRecord {
  const out: HeaderRecord = {};
  for (const [key, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const name = key.toLowerCase();
    if (allowed(name, policy)) out[name] = value;
  }
  return out;
}

/** First value of a header from a record, for reading single-valued headers. */
export function firstValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** Hop-by-hop headers (RFC 9110 §7.6.1) plus the proxy-era ones; never forwarded either way. */
export const HOP_BY_HOP: ReadonlySet<string> = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/**
 * A blacklist filter for the CLI proxy, where CLIs send API-specific headers we cannot
 * enumerate: drops hop-by-hop headers, any header the `Connection` header names, and the
 * `drop` set (credentials, host, forwarding headers).
 */
export function dropRawHeaders(raw: readonly string[], drop: ReadonlySet<string>): HeaderRecord {
  const named = new Set<string>();
  for (let i = 0; i + 1 < raw.length; i += 2) {
    if ((raw[i] as string).toLowerCase() === 'connection') {
      for (const token of (raw[i + 1] as string).split(',')) named.add(token.trim().toLowerCase());
    }
  }
  const out: HeaderRecord = {};
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = (raw[i] as string).toLowerCase();
    if (HOP_BY_HOP.has(name) || drop.has(name) || named.has(name) || name.startsWith('x-forwarded-')) continue;
    appendHeader(out, name, raw[i + 1] as string);
  }
  return out;
}

/** Same over an undici response header record. */
export function dropHeaderRecord(headers: Readonly<Record<string, string | string[] | undefined>>, drop: ReadonlySet<string>): HeaderRecord {
  const named = new Set(
    (firstValue(headers.connection) ?? '')
      .split(',')
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
  const out: HeaderRecord = {};
  for (const [key, value] of Object.entries(headers)) {
    const name = key.toLowerCase();
    if (value === undefined || HOP_BY_HOP.has(name) || drop.has(name) || named.has(name)) continue;
    out[name] = value;
  }
  return out;
}
