import { lookup } from 'node:dns/promises';
import type { IncomingMessage } from 'node:http';
import { connect as netConnect, isIP, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { TLSSocket } from 'node:tls';
import type { HotFile } from '../config/hot-file.js';
import type { Catalog } from '../data/catalog.js';
import { tlsProviderFor } from '../data/tls-hosts.js';
import { AppError, errorBody, type ErrorCode } from '../errors.js';
import type { Logger } from '../log/logger.js';
import { isLoopbackAddress } from '../net/loopback-address.js';
import type { LeafCache } from './leaf-cache.js';
import { resolveKey, type Destination, type ResolveMap } from './tls-upstream.js';

/**
 * `CONNECT host:port` on the cli-proxy (SPEC §10), from agent UIDs only. A catalog host of
 * a `tls` provider on 443 is intercepted: TLS is ended here with a leaf minted for that
 * name (ALPN http/1.1) and the requests inside go to the cli-proxy's own pipeline. Any
 * other target is tunnelled byte for byte: never intercepted, never given a token.
 */

export interface ConnectDeps {
  catalog: HotFile<Catalog>;
  log: Logger;
  leaves: LeafCache;
  /** The connection's peer decision; undefined when no peer check is configured. */
  peerAllowed: ((socket: Socket) => Promise<boolean>) | undefined;
  stopping: () => boolean;
  /** Hands a decrypted connection to the HTTP server of intercepted requests. */
  intercept: (tls: TLSSocket, outer: Socket, host: string) => void;
  resolve: ResolveMap;
}

export interface ConnectHandler {
  handle: (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
  /** Cuts every open tunnel (shutdown, after the in-flight requests had their grace). */
  closeAll: () => number;
}

/** `host:port`, `[v6]:port`; undefined if not an authority. */
export function parseAuthority(target: string | undefined): { host: string; port: number } | undefined {
  const m = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$/.exec(target ?? '');
  if (!m?.[1] || !m[2]) return undefined;
  const port = Number(m[2]);
  if (port < 1 || port > 65535) return undefined;
  return { host: m[1].replace(/^\[|\]$/g, '').toLowerCase().replace(/\.$/, ''), port };
}

function refuse(socket: Duplex, code: ErrorCode, message?: string): void {
  const err = new AppError(code, message);
  const body = errorBody(err);
  const reason = err.status === 403 ? 'Forbidden' : err.status === 502 ? 'Bad Gateway' : err.status === 503 ? 'Service Unavailable' : 'Bad Request';
  socket.end(`HTTP/1.1 ${err.status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
}

/**
 * Where a tunnel really connects: `--resolve` first (an operator's test aid, loopback
 * allowed), else DNS. A name or address that is loopback or unspecified is refused: from
 * here it would reach local services as the cli-proxy's own user, which they may trust.
 */
async function destination(host: string, port: number, resolve: ResolveMap): Promise<Destination | undefined> {
  const mapped = resolve.get(resolveKey(host, port));
  if (mapped) return mapped;
  const address = isIP(host) !== 0 ? host : (await lookup(host)).address;
  if (isLoopbackAddress(address) || address === '0.0.0.0' || address === '::' || host === 'localhost') return undefined;
  return { address, port };
}

export function createConnectHandler(deps: ConnectDeps): ConnectHandler {
  const open = new Set<Duplex>();
  const track = (s: Duplex): void => {
    open.add(s);
    s.once('close', () => open.delete(s));
  };

  const run = async (req: IncomingMessage, socket: Socket, head: Buffer): Promise<void> => {
    if (deps.stopping()) return refuse(socket, 'service_unavailable');
    if (!deps.peerAllowed) return refuse(socket, 'forbidden_peer', 'CONNECT is served to agent users only, and no agent users are configured (--agent-users-file).');
    if (!(await deps.peerAllowed(socket))) return refuse(socket, 'forbidden_peer');
    const target = parseAuthority(req.url);
    if (!target) return refuse(socket, 'not_found', 'CONNECT needs host:port.');
    const found = target.port === 443 ? tlsProviderFor(deps.catalog.current.value, target.host) : undefined;
    if (found) {
      const context = await deps.leaves.context(target.host);
      if (socket.destroyed) return;
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) socket.unshift(head);
      const tls = new TLSSocket(socket, { isServer: true, secureContext: context, ALPNProtocols: ['http/1.1'] });
      tls.on('error', () => tls.destroy());
      deps.intercept(tls, socket, target.host);
      return;
    }
    const to = await destination(target.host, target.port, deps.resolve).catch(() => null);
    if (to === undefined) return refuse(socket, 'forbidden_host', 'CONNECT to a loopback address is refused.');
    if (to === null || socket.destroyed) return refuse(socket, 'upstream_unreachable');
    const upstream = netConnect({ host: to.address, port: to.port });
    track(upstream);
    let bytesIn = 0;
    let bytesOut = 0;
    let connected = false;
    upstream.once('connect', () => {
      connected = true;
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) upstream.write(head);
      socket.on('data', (c: Buffer) => void (bytesIn += c.length));
      upstream.on('data', (c: Buffer) => void (bytesOut += c.length));
      socket.pipe(upstream);
      upstream.pipe(socket);
    });
    upstream.once('error', () => {
      if (!connected) refuse(socket, 'upstream_unreachable');
      else socket.destroy();
    });
    socket.once('close', () => upstream.destroy());
    upstream.once('close', () => {
      socket.destroy();
      deps.log.info({ outcome: 'tunnel', host: target.host, port: target.port, bytesIn, bytesOut }, 'CONNECT tunnel closed');
    });
  };

  return {
    handle(req, duplex, head) {
      const socket = duplex as Socket;
      track(socket);
      socket.on('error', () => socket.destroy());
      run(req, socket, head).catch((err: unknown) => {
        deps.log.error({ err: { name: (err as Error)?.name, message: (err as Error)?.message } }, 'CONNECT failed');
        if (!socket.destroyed) refuse(socket, 'upstream_unreachable');
      });
    },
    closeAll() {
      const n = open.size;
      for (const s of [...open]) s.destroy();
      return n;
    },
  };
}
