import type { IncomingMessage, ServerResponse } from 'node:http';
import type { z } from 'zod';
import { AppError } from '../../errors.js';
import { readBody } from '../../http/request-body.js';
import {
  ENROLL_PATH,
  PRESENCE_PATH,
  STATE_PATH,
  enrollRequestSchema,
  presenceSchema,
  stateAfterSchema,
  type EnrollRequest,
  type Presence,
} from '../../data/link-wire.js';
import { AUDIT_BODY_LIMIT, AUDIT_PATH, auditUploadSchema, type AuditUpload } from '../../data/audit-event.js';
import { bearerOf, isJsonContentType } from './gateway-http.js';
import type { HostControl, LinkResult } from './host-control.js';

/**
 * node:http glue for the host link endpoints of SPEC §8 in front of a `HostControl`, in
 * two steps (parse, then answer) so the test mock can inject faults between them.
 *
 *   POST /v1/host/enroll    400 bad_request (not JSON, not the schema), 413, else HostControl
 *   GET  /v1/host/state     400 bad_request (`after` not a non-negative integer); a missing
 *                           `after` is 0, so a new host gets the current state at once
 *   POST /v1/host/presence  400 bad_request, 413, 401, else 204
 *   POST /v1/host/audit     400 bad_request, 413, 401, else 200 {"accepted": n} (SPEC §9)
 *   a wrong method          405 with Allow
 * Bodies are `{"error": "<code>"}`; no echo of the request, ever.
 */

export const ENROLL_BODY_LIMIT = 64 * 1024;
/** A presence report lists every slot; 10 000 of them are about 1.5 MB. */
export const PRESENCE_BODY_LIMIT = 4 * 1024 * 1024;

export type HostEndpoint = 'enroll' | 'state' | 'presence' | 'audit';

export type HostParse =
  | { kind: 'not_host' }
  | { kind: 'client_gone'; endpoint: HostEndpoint }
  | { kind: 'answer'; endpoint: HostEndpoint; result: LinkResult }
  | { kind: 'enroll'; body: EnrollRequest }
  | { kind: 'state'; bearer: string | undefined; after: number }
  | { kind: 'presence'; bearer: string | undefined; body: Presence }
  | { kind: 'audit'; bearer: string | undefined; body: AuditUpload };

const ROUTES: Record<string, { endpoint: HostEndpoint; method: 'GET' | 'POST' }> = {
  [ENROLL_PATH]: { endpoint: 'enroll', method: 'POST' },
  [STATE_PATH]: { endpoint: 'state', method: 'GET' },
  [PRESENCE_PATH]: { endpoint: 'presence', method: 'POST' },
  [AUDIT_PATH]: { endpoint: 'audit', method: 'POST' },
};

function error(status: number, code: string, headers?: Record<string, string>): LinkResult {
  return headers ? { status, body: { error: code }, headers } : { status, body: { error: code } };
}

type BodyRead<T> = { ok: true; value: T } | { ok: false; parse: HostParse };

async function readJsonBody<T>(req: IncomingMessage, endpoint: HostEndpoint, schema: z.ZodType<T>, limit: number): Promise<BodyRead<T>> {
  let buf: Buffer;
  try {
    buf = await readBody(req, limit);
  } catch (err) {
    if (err instanceof AppError && err.code === 'payload_too_large') return { ok: false, parse: { kind: 'answer', endpoint, result: error(413, 'payload_too_large') } };
    return { ok: false, parse: { kind: 'client_gone', endpoint } };
  }
  const bad: BodyRead<T> = { ok: false, parse: { kind: 'answer', endpoint, result: error(400, 'bad_request') } };
  if (!isJsonContentType(req.headers['content-type'])) return bad;
  let json: unknown;
  try {
    json = JSON.parse(buf.toString('utf8')) as unknown;
  } catch {
    return bad;
  }
  const parsed = schema.safeParse(json);
  return parsed.success ? { ok: true, value: parsed.data } : bad;
}

/** Routes and parses one request; does not answer it. */
export async function parseHostHttp(req: IncomingMessage): Promise<HostParse> {
  const url = new URL(req.url ?? '/', 'http://gateway');
  const route = ROUTES[url.pathname];
  if (!route) return { kind: 'not_host' };
  const { endpoint } = route;
  if (req.method !== route.method) {
    req.resume();
    return { kind: 'answer', endpoint, result: error(405, 'method_not_allowed', { allow: route.method }) };
  }
  switch (endpoint) {
    case 'enroll': {
      const r = await readJsonBody(req, endpoint, enrollRequestSchema, ENROLL_BODY_LIMIT);
      return r.ok ? { kind: 'enroll', body: r.value } : r.parse;
    }
    case 'presence': {
      const r = await readJsonBody(req, endpoint, presenceSchema, PRESENCE_BODY_LIMIT);
      return r.ok ? { kind: 'presence', bearer: bearerOf(req), body: r.value } : r.parse;
    }
    case 'audit': {
      const r = await readJsonBody(req, endpoint, auditUploadSchema, AUDIT_BODY_LIMIT);
      return r.ok ? { kind: 'audit', bearer: bearerOf(req), body: r.value } : r.parse;
    }
    case 'state': {
      req.resume();
      const raw = url.searchParams.get('after');
      const after = stateAfterSchema.safeParse(raw === null || raw === '' ? 0 : raw);
      if (!after.success) return { kind: 'answer', endpoint, result: error(400, 'bad_request') };
      return { kind: 'state', bearer: bearerOf(req), after: after.data };
    }
  }
}

/** Writes a link answer (JSON, or nothing for 204). */
export function sendLinkResult(res: ServerResponse, result: LinkResult): void {
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  if (result.body === undefined) {
    res.writeHead(result.status, { 'cache-control': 'no-store', ...result.headers });
    res.end();
    return;
  }
  const text = JSON.stringify(result.body);
  res.writeHead(result.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
    ...result.headers,
  });
  res.end(text);
}

/** A state poll whose wait ends early when the client goes away (a dropped long poll). */
export async function answerStatePoll(control: HostControl, res: ServerResponse, bearer: string | undefined, after: number): Promise<void> {
  const gone = new AbortController();
  const onClose = (): void => gone.abort();
  res.once('close', onClose);
  try {
    const result = await control.pollState(bearer, after, gone.signal);
    if (!gone.signal.aborted) sendLinkResult(res, result);
  } finally {
    res.off('close', onClose);
  }
}

/**
 * Handles the request if it is a host link endpoint (true), else leaves it untouched and
 * resolves false. Settles once the answer has been written (a poll: after its wait).
 */
export async function handleHostHttp(control: HostControl, req: IncomingMessage, res: ServerResponse): Promise<boolean> {
  const parse = await parseHostHttp(req);
  switch (parse.kind) {
    case 'not_host':
      return false;
    case 'client_gone':
      res.destroy();
      return true;
    case 'answer':
      sendLinkResult(res, parse.result);
      return true;
    case 'enroll':
      sendLinkResult(res, control.enroll(parse.body));
      return true;
    case 'presence':
      sendLinkResult(res, control.presence(parse.bearer, parse.body));
      return true;
    case 'audit':
      sendLinkResult(res, control.audit(parse.bearer, parse.body));
      return true;
    case 'state':
      await answerStatePoll(control, res, parse.bearer, parse.after);
      return true;
  }
}
