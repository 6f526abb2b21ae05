import type { Readable } from 'node:stream';
import { Agent, errors as undiciErrors } from 'undici';
import { AppError } from '../errors.js';
import type { HeaderRecord } from './headers.js';

export interface UpstreamOptions {
  /** Time allowed for the upstream's response headers. Tool calls can be long. */
  headersTimeoutMs: number;
  connectTimeoutMs: number;
}

export const defaultUpstreamOptions: UpstreamOptions = {
  headersTimeoutMs: 10 * 60_000,
  connectTimeoutMs: 10_000,
};

export interface UpstreamRequest {
  url: URL;
  method: string;
  headers: HeaderRecord;
  body?: Buffer | Readable | null;
  signal: AbortSignal;
}

export interface UpstreamResponse {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: Readable & { dump(opts?: { limit: number }): Promise<void> };
}

/**
 * Creates the upstream dispatcher. `bodyTimeout: 0`: undici's default 300 s would cut a
 * silent SSE stream or a long tool call. TLS verification stays on (undici's default);
 * nothing here can turn it off. Redirects are never followed (plain dispatch).
 */
export function createUpstreamAgent(options: UpstreamOptions = defaultUpstreamOptions): Agent {
  return new Agent({
    headersTimeout: options.headersTimeoutMs,
    bodyTimeout: 0,
    connect: { timeout: options.connectTimeoutMs },
    keepAliveTimeout: 4_000,
    pipelining: 1,
  });
}

/** Sends one request upstream; resolves at the upstream's response headers. */
export async function dispatchUpstream(agent: Agent, req: UpstreamRequest): Promise<UpstreamResponse> {
  try {
    const res = await agent.request({
      origin: req.url.origin,
      path: req.url.pathname + req.url.search,
      method: req.method as 'GET',
      headers: req.headers,
      body: req.body ?? null,
      signal: req.signal,
    });
    return res as unknown as UpstreamResponse;
  } catch (err) {
    throw mapUpstreamError(err, req.signal);
  }
}

/** Raised when the request was aborted by us (the agent went away): nobody to answer. */
export class AbortedError extends Error {
  constructor() {
    super('aborted');
    this.name = 'AbortedError';
  }
}

/**
 * Maps a failure before response headers to our error table. The message never carries
 * the upstream's host, port, path, errno or TLS text: only the code's fixed message.
 * Timeouts are 504; refused/reset/DNS/TLS and anything else from the socket are 502.
 */
export function mapUpstreamError(err: unknown, signal?: AbortSignal): AppError | AbortedError {
  if (signal?.aborted) return new AbortedError();
  if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.ConnectTimeoutError) {
    return new AppError('upstream_timeout');
  }
  if (err instanceof undiciErrors.InvalidArgumentError) return new AppError('internal_error');
  return new AppError('upstream_unreachable');
}
