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
  suffixes?: readonly string[];
}

export const agentToUpstreamPolicy: HeaderPolicy = { names: agentToUpstream, prefixes: ['mcp-param-'] };
export const upstreamToAgentPolicy: HeaderPolicy = { names: upstreamToAgent };

/**
 * SaaS → CLI (docs/shims.md): what real CLIs read of an answer (gh, aws, glab, curl, git
 * over HTTPS, vendor SDKs). Not `set-cookie` (a session the agent could keep), not
 * `content-location` or `refresh` (URLs no CLI follows, which a SaaS may fill with the
 * request it got), not `server`/`x-powered-by`/`via` (noise). `www-authenticate` passes:
 * unlike an MCP client, a CLI answers a challenge only with its own placeholder, and git
 * and docker read it to word their error.
 */
export const cliUpstreamToAgentPolicy: HeaderPolicy = {
  names: new Set([
    // the body: how to read it
    'content-type',
    'content-length',
    'content-encoding',
    'content-language',
    'content-disposition', // curl -J, gh release download: the file name
    'content-range', // ranged and resumed downloads (curl -C, aws s3 cp)
    'accept-ranges',
    'content-md5',
    'content-digest',
    'repr-digest',
    'digest',
    // caching and conditional requests (gh's and the SDKs' ETag caches)
    'etag',
    'last-modified',
    'cache-control',
    'expires',
    'pragma', // git's smart HTTP sends it
    'vary',
    'age',
    'date', // the AWS SDKs correct clock skew from it
    // navigation
    'link', // pagination (gh api --paginate, GitLab, Jira)
    'location', // rewritten to the proxy when it points back into the upstream
    'allow',
    // throttling and lifecycle
    'retry-after',
    'deprecation',
    'sunset',
    'warning',
    // auth diagnostics: scopes the token has or a call needs (gh auth status, 403 hints)
    'www-authenticate',
    'x-oauth-scopes',
    'x-accepted-oauth-scopes',
    'x-accepted-github-permissions',
    'x-poll-interval',
    // request ids for support tickets
    'request-id',
    'x-request-id',
    'x-correlation-id',
    // header-based pagination (GitLab, many REST APIs)
    'x-total',
    'x-total-count',
    'x-total-pages',
    'x-page',
    'x-per-page',
    'x-next-page',
    'x-prev-page',
  ]),
  prefixes: [
    'ratelimit', // the IETF RateLimit fields: ratelimit, ratelimit-policy, ratelimit-remaining…
    'x-ratelimit',
    'x-rate-limit',
    'x-github-', // x-github-request-id, x-github-sso, x-github-otp, x-github-media-type
    'x-gitlab-',
    'x-amz-', // S3 object metadata, checksums, request ids, version ids
    'x-amzn-', // x-amzn-errortype: how the AWS CLI names an error
    'x-goog-',
    'x-guploader-',
    'x-ms-',
  ],
  suffixes: ['-request-id'], // x-notion-request-id, x-stripe-…, the rest of the vendors' ids
};

function allowed(name: string, policy: HeaderPolicy): boolean {
  if (policy.names.has(name)) return true;
  if (policy.prefixes?.some((p) => name.startsWith(p))) return true;
  return policy.suffixes?.some((s) => name.endsWith(s)) ?? false;
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

/**
 * The same filter into a flat list ([name, value, name, value, ...], lower-cased names),
 * as undici takes a request's headers: a repeated header stays where the peer sent each of
 * its lines. The forwarder's request to the upstream: one array per request, where a
 * record cost an object grown a property at a time and undici's Object.keys over it.
 */
export function filterRawHeaderList(raw: readonly string[], policy: HeaderPolicy, room = 0): string[] {
  // Sized once for the most it can hold and the caller's `room` (its own headers, pushed
  // after): growing by push cost two stores per request. Cut to what was kept, which
  // leaves the store as it is.
  const out = new Array<string>(raw.length + room);
  let n = 0;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = (raw[i] as string).toLowerCase();
    if (!allowed(name, policy)) continue;
    out[n++] = name;
    out[n++] = raw[i + 1] as string;
  }
  out.length = n;
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
  // for…in, not Object.entries: no array of pairs per answer (undici's record is a plain object).
  for (const key in headers) {
    if (!Object.hasOwn(headers, key)) continue;
    const value = headers[key];
    if (value === undefined) continue;
    const name = key.toLowerCase();
    if (allowed(name, policy)) out[name] = value;
  }
  return out;
}

/**
 * An upstream's response headers through an allow-list, less any header the upstream's
 * own `Connection` names (an allowed name made hop-by-hop is the upstream's to keep).
 */
export function filterResponseRecord(headers: Readonly<Record<string, string | string[] | undefined>>, policy: HeaderPolicy): HeaderRecord {
  return filterHeaderRecord(dropHeaderRecord(headers, new Set()), policy);
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
