import type { IncomingMessage, ServerResponse } from 'node:http';
import { AppError } from '../../errors.js';
import { readBody } from '../../http/request-body.js';
import type { RenewAuthority, RenewBody, RenewResult } from './authority.js';
import { matchRenewPath, renewRequestSchema, type RenewRequest } from '../../data/renew-wire.js';

/**
 * node:http glue for the Gateway side of renewal: `POST /v1/host/credentials/{slot}/renew`
 * in front of a `RenewAuthority`. Used by the dev demo Gateway and (piece by piece, to
 * inject faults between parsing and answering) by the test mock.
 *
 * Answers, in this order:
 *   - not `/v1/host/credentials/<segment>/renew`     → not handled (false): route elsewhere
 *   - method other than POST                         → 405 method_not_allowed, `Allow: POST`
 *   - segment not a slot id (bad alphabet, `%2F`, …)  → 400 bad_request
 *   - body over 64 KiB                               → 413 payload_too_large
 *   - content-type not application/json, body not JSON, or not the request schema
 *                                                    → 400 bad_request
 *   - otherwise whatever the authority answers (401, 404, 409, 200).
 * Bodies are exactly SPEC §4's `{"error": "<code>"}`; no echo of the request, ever.
 */

export const RENEW_BODY_LIMIT = 64 * 1024;

/** A parsed renewal request. `bearer` is the host credential: never log or store it. */
export interface ParsedRenew {
  slot: string;
  bearer: string | undefined;
  body: RenewRequest;
}

export type RenewParse =
  | { kind: 'not_renew' }
  | { kind: 'answer'; result: RenewResult; slot?: string }
  | { kind: 'client_gone' }
  | { kind: 'renew'; request: ParsedRenew };

/** The bearer credential from an Authorization header (scheme case-insensitive). */
export function bearerOf(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization;
  if (header === undefined) return undefined;
  const m = /^Bearer +([\x21-\x7e]+) *$/i.exec(header);
  return m ? m[1] : undefined;
}

export function isJsonContentType(value: string | undefined): boolean {
  if (value === undefined) return false;
  const mediaType = value.split(';', 1)[0]?.trim().toLowerCase();
  return mediaType === 'application/json';
}

function answer(status: number, code: string, headers?: Record<string, string>): RenewResult {
  return headers ? { status, body: { error: code }, headers } : { status, body: { error: code } };
}

/** Routes and parses one request; does not answer it. */
export async function parseRenewHttp(req: IncomingMessage, bodyLimit = RENEW_BODY_LIMIT): Promise<RenewParse> {
  const raw = req.url ?? '/';
  const q = raw.indexOf('?');
  const pathname = q === -1 ? raw : raw.slice(0, q);
  const match = matchRenewPath(pathname);
  if (match === undefined) return { kind: 'not_renew' };
  if (req.method !== 'POST') {
    req.resume();
    return { kind: 'answer', result: answer(405, 'method_not_allowed', { allow: 'POST' }) };
  }
  if (!match.ok) {
    req.resume();
    return { kind: 'answer', result: answer(400, 'bad_request') };
  }
  const slot = match.slot;
  let buf: Buffer;
  try {
    buf = await readBody(req, bodyLimit);
  } catch (err) {
    if (err instanceof AppError && err.code === 'payload_too_large') {
      return { kind: 'answer', slot, result: answer(413, 'payload_too_large') };
    }
    return { kind: 'client_gone' };
  }
  if (!isJsonContentType(req.headers['content-type'])) return { kind: 'answer', slot, result: answer(400, 'bad_request') };
  let json: unknown;
  try {
    json = JSON.parse(buf.toString('utf8')) as unknown;
  } catch {
    return { kind: 'answer', slot, result: answer(400, 'bad_request') };
  }
  const parsed = renewRequestSchema.safeParse(json);
  if (!parsed.success) return { kind: 'answer', slot, result: answer(400, 'bad_request') };
  return { kind: 'renew', request: { slot, bearer: bearerOf(req), body: parsed.data } };
}

/** Writes a renewal answer as JSON. Never cached: a 200 carries a token. */
export function sendRenewResult(res: ServerResponse, result: RenewResult): void {
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  const text = JSON.stringify(result.body satisfies RenewBody);
  res.writeHead(result.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
    ...result.headers,
  });
  res.end(text);
}

/**
 * Handles the request if it is on the renewal path (true), else leaves it untouched and
 * resolves false. The returned promise settles once the answer has been written.
 */
export async function handleRenewHttp(
  authority: RenewAuthority,
  req: IncomingMessage,
  res: ServerResponse,
  bodyLimit = RENEW_BODY_LIMIT,
): Promise<boolean> {
  const parse = await parseRenewHttp(req, bodyLimit);
  switch (parse.kind) {
    case 'not_renew':
      return false;
    case 'client_gone':
      res.destroy();
      return true;
    case 'answer':
      sendRenewResult(res, parse.result);
      return true;
    case 'renew': {
      const { slot, bearer, body } = parse.request;
      sendRenewResult(res, authority.renew(slot, bearer, body));
      return true;
    }
  }
}
