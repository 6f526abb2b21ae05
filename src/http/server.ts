import { createServer, STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { AppError, errorBody } from '../errors.js';
import type { ListenAddress } from './loopback.js';

export interface ServerLimits {
  /** Largest total header block, bytes. */
  maxHeaderSize: number;
  /** Time a client has to send its full header block. */
  headersTimeoutMs: number;
  /** Time a client has to send its full request (headers and body). */
  requestTimeoutMs: number;
  /** Idle keep-alive connections are closed after this. */
  keepAliveTimeoutMs: number;
}

export const defaultServerLimits: ServerLimits = {
  maxHeaderSize: 16 * 1024,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 30_000,
  keepAliveTimeoutMs: 5_000,
};

export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/**
 * A loopback HTTP server hardened against slow or hostile local clients: bounded header
 * size, header and whole-request deadlines. There is deliberately no socket idle timeout
 * (`server.timeout` 0): a response may be an SSE stream that is silent for hours.
 */
export function createLoopbackServer(handler: Handler, limits: ServerLimits = defaultServerLimits): Server {
  const server = createServer(
    {
      maxHeaderSize: limits.maxHeaderSize,
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      keepAliveTimeout: limits.keepAliveTimeoutMs,
      noDelay: true,
      connectionsCheckingInterval: 1_000,
    },
    handler,
  );
  server.timeout = 0;
  // Node hands CONNECT to a 'connect' listener, never to the handler; without one it just
  // drops the socket. The forwarder never tunnels: 405 like any other refused method. The
  // cli-proxy replaces this listener with TLS mode's (LoopbackServiceSpec.connect).
  server.on('connect', (_req, socket: Duplex) => {
    socket.end(rawErrorResponse(new AppError('method_not_allowed')));
  });
  return server;
}

/** An error answer written on the socket itself, outside any request; it closes the connection. */
export function rawErrorResponse(err: AppError): string {
  const body = errorBody(err);
  const headers = Object.entries(err.headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('');
  return `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status] ?? ''}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\ncache-control: no-store\r\n${headers}connection: close\r\n\r\n${body}`;
}

/**
 * Refuses a connection before (or without) a request: the answer, then our side closed;
 * the descriptor goes when the client closes its side, or after a second at most, so a
 * client that never does cannot hold it.
 */
export function refuseConnection(socket: Socket, err: AppError): void {
  const timer = setTimeout(() => socket.destroy(), 1_000);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
  socket.once('end', () => socket.destroy());
  socket.end(rawErrorResponse(err));
}

export function listen(server: Server, address: ListenAddress): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once('error', onError);
    server.listen({ host: address.host, port: address.port, exclusive: true }, () => {
      server.off('error', onError);
      resolve(server.address() as AddressInfo);
    });
  });
}

/** Tracks responses still in flight so shutdown can wait for them, then cut the rest. */
export class InFlight {
  private readonly active = new Set<ServerResponse>();
  private readonly streams = new WeakSet<ServerResponse>();
  private waiters: Array<() => void> = [];

  /**
   * Marks a response as an open-ended stream (MCP's standalone GET stream): it has no end
   * to wait for, so shutdown cuts it at once instead of holding the stop for the whole
   * grace period. The client reconnects (and may resume with Last-Event-ID).
   */
  markStream(res: ServerResponse): void {
    this.streams.add(res);
  }

  /** Cuts every marked stream; returns how many. */
  cutStreams(): number {
    let n = 0;
    for (const res of [...this.active]) {
      if (this.streams.has(res)) {
        res.destroy();
        n++;
      }
    }
    return n;
  }

  /** Cutting a response (`res.destroy()`) also aborts its upstream request (UpstreamCall). */
  add(res: ServerResponse): void {
    this.enter(res);
    res.once('close', () => this.leave(res));
  }

  /**
   * `add` for a caller that has a 'close' listener of its own and calls `leave` from it
   * (the request pipeline): one listener fewer per request.
   */
  enter(res: ServerResponse): void {
    this.active.add(res);
  }

  /** The response closed. */
  leave(res: ServerResponse): void {
    this.active.delete(res);
    if (this.active.size === 0 && this.waiters.length > 0) {
      for (const w of this.waiters) w();
      this.waiters = [];
    }
  }

  get size(): number {
    return this.active.size;
  }

  /** Resolves true when all finished within `graceMs`, false when the rest were cut. */
  async drain(graceMs: number): Promise<boolean> {
    if (this.active.size === 0) return true;
    let timer: NodeJS.Timeout | undefined;
    const finished = await Promise.race([
      new Promise<boolean>((resolve) => this.waiters.push(() => resolve(true))),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), graceMs);
      }),
    ]);
    clearTimeout(timer);
    if (!finished) {
      for (const res of [...this.active]) res.destroy();
    }
    return finished;
  }
}

/**
 * Stops accepting, cuts open-ended streams, lets the other in-flight responses finish
 * within `graceMs`, then cuts them. `clean`: everything else finished in time.
 */
export async function closeGracefully(
  server: Server,
  inflight: InFlight,
  graceMs: number,
  /** Cuts connections the HTTP server no longer tracks (CONNECT tunnels), which would hold the close. */
  cutDetached?: () => void,
): Promise<{ clean: boolean; streamsCut: number }> {
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeIdleConnections();
  const streamsCut = inflight.cutStreams();
  const clean = await inflight.drain(graceMs);
  server.closeAllConnections();
  cutDetached?.();
  await closed;
  return { clean, streamsCut };
}
