import { Agent, buildConnector } from 'undici';
import type { Socket } from 'node:net';
import { guardedConnector, type UpstreamGuard } from './upstream-guard.js';

export interface UpstreamOptions {
  /** Time allowed for the upstream's response headers. Tool calls can be long. */
  headersTimeoutMs: number;
  connectTimeoutMs: number;
  /** UIDs besides root and the service's own whose plain-http loopback listeners may get a token (`--loopback-owner-uids`). */
  loopbackOwnerUids?: ReadonlySet<number> | undefined;
  /** This host's own listener ports (both proxies', metrics), as configured: never an upstream. */
  reservedPorts?: readonly number[] | undefined;
}

export const defaultUpstreamOptions: UpstreamOptions = {
  headersTimeoutMs: 10 * 60_000,
  connectTimeoutMs: 10_000,
};

/**
 * Creates the upstream dispatcher. `bodyTimeout: 0`: undici's default 300 s would cut a
 * silent SSE stream or a long tool call. TLS verification stays on (undici's default);
 * nothing here can turn it off. Redirects are never followed (plain dispatch).
 */
export function createUpstreamAgent(options: UpstreamOptions = defaultUpstreamOptions, guard?: UpstreamGuard): Agent {
  const connector = buildConnector({ timeout: options.connectTimeoutMs });
  return new Agent({
    headersTimeout: options.headersTimeoutMs,
    bodyTimeout: 0,
    // The timer starts once the guard has passed the socket: its lookup is not idle time.
    connect: guardedConnector(connector, guard, closeIfNeverUsed),
    keepAliveTimeout: 4_000,
    pipelining: 1,
  });
}

/** How long a fresh upstream connection may stay without carrying a request. */
export const UNUSED_CONNECTION_MS = 500;

/**
 * undici (7.x, nodejs/undici#5845) reconnects after a request is aborted mid-response —
 * every SSE stream an agent closes — only to find the request gone, and that new
 * connection carries no keep-alive timer: it would idle until the Gateway closes it. A
 * connection that has not written a byte this long after connecting is such a leftover
 * (a real request is written as soon as the socket connects); closing it costs nothing,
 * undici connects again on demand.
 */
function closeIfNeverUsed(socket: Socket): void {
  setTimeout(() => {
    if (socket.bytesWritten === 0 && !socket.destroyed) socket.destroy();
  }, UNUSED_CONNECTION_MS).unref();
}
