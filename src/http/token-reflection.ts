import type { Logger } from '../log/logger.js';
import type { HeaderRecord } from './headers.js';
import type { AccessRecord } from './request-pipeline.js';

/*
 * The last check on a proxy's response headers: an upstream may reflect the request it
 * got (a pagination Link repeating the query, an echo header, a Refresh URL) and so hand
 * the token we injected back to the agent. Pure functions over a header record, run after
 * the allow-list, with the token injected into that request.
 */

/** What to look for in a header: the token's spellings, found plain or after percent-decoding. */
export interface TokenNeedles {
  readonly token: string;
  /** Base64 spellings: exact ones and the alignment-independent cores (see `base64Cores`). */
  readonly base64: readonly string[];
  /**
   * The same spellings lower-cased, for header names (which arrive lower-cased). Built
   * once with the needles: a proxy that keeps its needles per token then pays nothing per
   * answer for them.
   */
  readonly lowered?: { readonly token: string; readonly base64: readonly string[] };
}

/**
 * Shorter than this, a base64 core is too likely to occur by chance in an unrelated
 * header; the exact base64 spellings still apply to such a token.
 */
const MIN_CORE_CHARS = 12;

/**
 * The base64 characters that depend on `token`'s bytes alone, for each of the three
 * alignments it can have inside a longer base64 blob (`user:token`, a JSON credential,
 * anything): whatever surrounds the token, one of these appears in the blob's encoding.
 */
export function base64Cores(token: string): string[] {
  const cores: string[] = [];
  const n = Buffer.byteLength(token);
  for (let pad = 0; pad < 3; pad++) {
    const encoded = Buffer.from(`${'\0'.repeat(pad)}${token}`).toString('base64');
    // Character c holds bits [6c, 6c+6); the token holds bits [8·pad, 8·(pad+n)).
    const first = Math.ceil((8 * pad) / 6);
    const end = Math.floor((8 * (pad + n)) / 6);
    const core = encoded.slice(first, end);
    if (core.length >= MIN_CORE_CHARS) cores.push(core);
  }
  return cores;
}

/**
 * The needles for one request's token. A token long enough for all three base64 cores is
 * found through them alone: any base64 holding its bytes (`user:token` as a basic inject
 * builds it, `token:`, the bare token) contains one. A shorter one is looked for in the
 * exact base64 of `credentials` (the pairs the proxy encoded itself), `token:`, `:token`
 * and the bare token. Run on every answer, so kept to three encodings for a real token.
 */
export function tokenNeedles(token: string, credentials: readonly string[] = []): TokenNeedles {
  const cores = base64Cores(token);
  const standard =
    cores.length === 3
      ? cores
      : [token, `${token}:`, `:${token}`, ...credentials].flatMap((s) => {
          const b = Buffer.from(s).toString('base64');
          return [b, b.replace(/=+$/, '')];
        });
  const urlSafe = standard.filter((s) => /[+/]/.test(s)).map((s) => s.replace(/\+/g, '-').replace(/\//g, '_'));
  const base64 = [...new Set([...standard, ...urlSafe])].filter((s) => s.length > 0);
  return { token, base64, lowered: { token: token.toLowerCase(), base64: base64.map((b) => b.toLowerCase()) } };
}

/**
 * Percent-decoding that never throws: `%XX` becomes its byte as a character. Tokens are
 * visible ASCII (token-file.ts), so a byte-wise decode finds any encoding of one,
 * encodeURIComponent's and form-encoding's alike, in either hex case.
 */
function percentDecode(text: string): string {
  return text.replace(/%([0-9A-Fa-f]{2})/g, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
}

/** Whether `text` holds the token raw, percent-encoded (up to twice) or in base64. */
export function holdsToken(text: string, needles: TokenNeedles): boolean {
  let variant = text;
  for (let round = 0; round < 3; round++) {
    if (variant.includes(needles.token)) return true;
    for (const b of needles.base64) if (variant.includes(b)) return true;
    if (!variant.includes('%')) return false;
    const next = percentDecode(variant);
    if (next === variant) return false;
    variant = next;
  }
  return false;
}

export interface TokenCheck {
  headers: HeaderRecord;
  /** Names of the headers (or of the repeated values) dropped; a name that itself held the token is not repeated. */
  dropped: string[];
}

/** Stands in for a header name that itself held the token: never logged. */
export const WITHHELD_NAME = '(name withheld)';

/**
 * Drops every header value that holds the token (a repeated header loses only the values
 * that do), and every header whose name does.
 */
export function dropTokenHeaders(headers: Readonly<HeaderRecord>, needles: TokenNeedles): TokenCheck {
  const out: HeaderRecord = {};
  const dropped: string[] = [];
  // Names arrive lower-cased: a token reflected into one is looked for the same way.
  const lowered: TokenNeedles = needles.lowered ?? { token: needles.token.toLowerCase(), base64: needles.base64.map((b) => b.toLowerCase()) };
  // for…in, not Object.entries: no array of pairs per answer (the record is a plain object).
  for (const name in headers) {
    if (!Object.hasOwn(headers, name)) continue;
    const value = headers[name] as string | string[];
    if (holdsToken(name, lowered)) {
      dropped.push(WITHHELD_NAME);
      continue;
    }
    if (Array.isArray(value)) {
      const kept = value.filter((v) => !holdsToken(v, needles));
      if (kept.length < value.length) dropped.push(name);
      if (kept.length > 0) out[name] = kept.length === 1 ? (kept[0] as string) : kept;
    } else if (holdsToken(value, needles)) {
      dropped.push(name);
    } else {
      out[name] = value;
    }
  }
  return { headers: out, dropped };
}

/**
 * The last check as both proxies run it on an answer: the headers without the token, the
 * drop logged once per response by header name (never a value) and counted on the
 * request's access record (`tokenHeadersDropped`, which the metrics read).
 */
export function withoutReflectedToken(headers: HeaderRecord, needles: TokenNeedles, rec: AccessRecord, log: Logger): HeaderRecord {
  // Nearly every answer is clean: then the record is the caller's own, passed on as it is
  // (no second record and no list of drops per answer).
  if (!reflects(headers, needles)) return headers;
  const check = dropTokenHeaders(headers, needles);
  if (check.dropped.length > 0) {
    rec.tokenHeadersDropped = check.dropped.length;
    log.warn({ reqId: rec.reqId, headers: check.dropped }, 'dropped response headers holding the token');
  }
  return check.headers;
}

/** Whether any header name or value holds the token: dropTokenHeaders's test, without building its answer. */
function reflects(headers: Readonly<HeaderRecord>, needles: TokenNeedles): boolean {
  const lowered: TokenNeedles = needles.lowered ?? { token: needles.token.toLowerCase(), base64: needles.base64.map((b) => b.toLowerCase()) };
  for (const name in headers) {
    if (!Object.hasOwn(headers, name)) continue;
    if (holdsToken(name, lowered)) return true;
    const value = headers[name] as string | string[];
    if (Array.isArray(value)) {
      for (const v of value) if (holdsToken(v, needles)) return true;
    } else if (holdsToken(value, needles)) return true;
  }
  return false;
}
