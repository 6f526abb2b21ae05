import type { ServerResponse } from 'node:http';
import { errors as undiciErrors } from 'undici';

/**
 * Every error class of the project, in one file (undici's lib/core/errors.js shape):
 * - AppError: what an agent sees, a stable code from the table below → HTTP status + JSON.
 * - ClientGoneError: the agent left mid-request; nobody to answer, nothing to log as a fault.
 * - ConfigError: a usage or configuration problem; the CLI exits 2.
 * - ServiceFailedError, FetchIncompleteError: a long-running part or a one-shot run
 *   failed; the CLI exits with the cause's code (1 unless the cause says otherwise).
 * - EnrollError: enrol or unenrol failed at run time; the CLI exits 1.
 * - anything else thrown reaches an agent as internal_error and the CLI as exit 1.
 */

/**
 * The one table of errors a client can see. Codes are stable wire names; the README's
 * error list is checked against this table by test/errors.test.ts.
 */
export const errorTable = {
  not_found: { status: 404, message: 'No such route.' },
  unknown_binding: { status: 404, message: 'No binding with this id is configured on this host.' },
  unknown_provider: { status: 404, message: 'No provider with this name is configured on this host.' },
  method_not_allowed: { status: 405, message: 'This method is not allowed on this path.' },
  aws_request_unsigned: { status: 400, message: 'This AWS request cannot be signed again with the real key; nothing was sent.' },
  payload_too_large: { status: 413, message: 'The request body exceeds the configured limit.' },
  forbidden_host: { status: 403, message: 'The Host header must name this loopback listener.' },
  forbidden_origin: { status: 403, message: 'Requests from a non-loopback Origin are refused.' },
  forbidden_peer: { status: 403, message: 'This local user is not allowed to use this service.' },
  token_unavailable: { status: 503, message: 'No valid token is available for this binding; renewal may not have run yet.' },
  token_rejected: { status: 503, message: 'The upstream rejected the current token; renewal may be failing.' },
  upstream_unreachable: { status: 502, message: 'The upstream could not be reached.' },
  upstream_untrusted: { status: 502, message: 'The upstream is plain http on loopback and its listener belongs to a user not trusted with a token; nothing was sent.' },
  upstream_loop: { status: 502, message: "The upstream is one of this host's own listeners; nothing was sent." },
  upstream_timeout: { status: 504, message: 'The upstream did not answer in time.' },
  too_many_connections: { status: 429, message: 'This local user has too many connections open to this service.' },
  too_many_streams: { status: 429, message: 'This local user has too many requests in flight on this service.' },
  rate_limited: { status: 429, message: 'This local user sends requests faster than this service allows.' },
  overloaded: { status: 503, message: 'This service has no room for another connection now.' },
  service_unavailable: { status: 503, message: 'The service is shutting down.' },
  internal_error: { status: 500, message: 'Internal error.' },
} as const satisfies Record<string, { status: number; message: string }>;

export type ErrorCode = keyof typeof errorTable;

export const errorCodes = Object.keys(errorTable) as ErrorCode[];

/** The project's one error type: a stable code plus an optional safer-than-default detail. */
export class AppError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;

  constructor(code: ErrorCode, message?: string, headers: Record<string, string> = {}) {
    super(message ?? errorTable[code].message);
    this.name = 'AppError';
    this.code = code;
    this.status = errorTable[code].status;
    this.headers = headers;
  }
}

/** Normalises anything thrown into an AppError; unknown errors become internal_error with no detail. */
export function toAppError(err: unknown): AppError {
  return err instanceof AppError ? err : new AppError('internal_error');
}

export function errorBody(err: AppError): string {
  return JSON.stringify({ error: err.code, message: err.message });
}

/**
 * Writes the JSON error answer. If headers already went out, the only honest signal left
 * is to cut the connection, so the agent sees a truncated stream rather than a lie.
 */
export function sendError(res: ServerResponse, err: AppError, extraHeaders: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(err);
  res.writeHead(err.status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
    ...err.headers,
    ...extraHeaders,
  });
  res.end(body);
}

/**
 * Maps a failure before response headers to the table. The message never carries the
 * upstream's host, port, path, errno or TLS text: only the code's fixed message. Timeouts
 * are 504; refused/reset/DNS/TLS and anything else from the socket are 502.
 */
export function mapUpstreamError(err: unknown, clientGone: boolean): AppError | ClientGoneError {
  if (clientGone) return new ClientGoneError();
  // The upstream guard's refusal (upstream-guard.ts), passed through undici's connect.
  if (err instanceof AppError) return err;
  if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.ConnectTimeoutError) {
    return new AppError('upstream_timeout');
  }
  if (err instanceof undiciErrors.InvalidArgumentError) return new AppError('internal_error');
  return new AppError('upstream_unreachable');
}

/**
 * The agent went away (before its request was complete, or while we waited on the
 * upstream): the request is abandoned and there is nobody to answer.
 */
export class ClientGoneError extends Error {
  constructor() {
    super('client closed the connection');
    this.name = 'ClientGoneError';
  }
}

/** Configuration or usage problems: the CLI exits 2 with the message. */
export class ConfigError extends Error {
  readonly exitCode = 2;
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

/** A part of the process failed; the runner stopped the others. Exit code of the cause. */
export class ServiceFailedError extends Error {
  readonly exitCode: number;
  constructor(
    readonly service: string,
    cause: unknown,
  ) {
    super(`${service}: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = 'ServiceFailedError';
    this.exitCode = exitCodeOf(cause);
  }
}

/** `renew fetch --once` could not settle every due slot (or the credential was refused): exit 1. */
export class FetchIncompleteError extends Error {
  readonly exitCode = 1;
  constructor(message: string) {
    super(message);
    this.name = 'FetchIncompleteError';
  }
}

/**
 * `enroll` or `unenroll` could not finish (pairing code refused, Gateway unreachable,
 * credential not writable): exit 1. The message says the cause and what to do, and never
 * carries the pairing code or the credential.
 */
export class EnrollError extends Error {
  readonly exitCode = 1;
  constructor(message: string) {
    super(message);
    this.name = 'EnrollError';
  }
}

/**
 * Process exit codes: 0 ok, 1 runtime failure, 2 usage or configuration error. An error
 * class that means something else carries its own `exitCode`.
 */
export function exitCodeOf(err: unknown): number {
  const code = (err as { exitCode?: unknown } | null)?.exitCode;
  return typeof code === 'number' && Number.isInteger(code) && code > 0 ? code : 1;
}
