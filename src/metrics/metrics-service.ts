import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { ConfigError } from '../errors.js';
import { checkHost, parseListen, type ListenAddress } from '../http/loopback.js';
import { choosePeerUidLookup } from '../http/peer-uid.js';
import { listen } from '../http/server.js';
import type { Service } from '../service/service.js';
import type { Exposition } from './merged-exposition.js';

/**
 * `--metrics-listen HOST:PORT`: loopback only, like the proxies (the series name tools and
 * slots, nothing secret, but nothing for the network either), and never the agents' own
 * port, so a scrape is never mistaken for an agent's request. `off` (the default) serves
 * nothing.
 */
export function parseMetricsListen(value: string | undefined, partListen?: ListenAddress): ListenAddress | undefined {
  if (value === undefined || value === 'off') return undefined;
  const address = parseListen(value, '--metrics-listen');
  if (partListen && address.port !== 0 && address.port === partListen.port) {
    throw new ConfigError(`--metrics-listen must not be the part's own port (${partListen.port}): metrics get a port of their own`);
  }
  return address;
}

export interface MetricsServiceOptions {
  listen: ListenAddress;
  /** A part's registry, or (dev) several merged. */
  registry: Exposition;
  /** Called once listening, with the bound port (tests use port 0). */
  onListening?: ((port: number) => void) | undefined;
  /**
   * UIDs that may read the metrics besides root and the process's own user
   * (`--metrics-allowed-uids`: a Prometheus scraper's). Agents are not in by default:
   * the series name every agent's tools and slots.
   */
  allowedUids?: ReadonlySet<number> | undefined;
}

/**
 * Serves the registry in Prometheus text at `GET /metrics`, nothing else. The Host check
 * is the proxies' (a web page reached through DNS rebinding reads nothing); the values are
 * computed at the scrape, so between scrapes this costs nothing.
 */
export function createMetricsService(options: MetricsServiceOptions): Service {
  return {
    name: 'metrics',
    async run({ signal, log }) {
      let port = options.listen.port;
      const own = process.getuid?.();
      const allowed = new Set([0, ...(own === undefined ? [] : [own]), ...(options.allowedUids ?? [])]);
      const { lookup, method, close } = await choosePeerUidLookup();
      // The link's unit has no AF_NETLINK (apply's no network): there the lookup falls back to /proc/net/tcp.
      if (method !== 'sock_diag') log.info({ method }, 'metrics peer check: the sock_diag helper is unusable here; using the fallback');
      // Looked up once per connection, as the proxies do; a scraper keeps its connection alive.
      const peerOk = new WeakMap<Socket, Promise<boolean>>();
      const server = createServer({ maxHeaderSize: 16 * 1024, headersTimeout: 10_000, requestTimeout: 30_000 }, (req, res) => {
        void (peerOk.get(req.socket) ?? Promise.resolve(false)).then((ok) => {
          if (ok) serve(req, res);
          else {
            res.shouldKeepAlive = false;
            answer(res, 403, 'forbidden: this user may not read the metrics (root, the service user and --metrics-allowed-uids may)\n');
          }
        });
      });
      let refusedLogged = false;
      server.on('connection', (socket: Socket) => {
        const decision = lookup(socket.remoteAddress ?? '', socket.remotePort ?? 0, socket.localAddress ?? '', socket.localPort ?? 0).then((uid) => {
          const ok = uid !== undefined && allowed.has(uid);
          // Once per process: a scraper configured with the wrong user would fill the log.
          if (!ok && !refusedLogged && !socket.destroyed) log.warn({ uid: uid ?? null }, 'metrics: connection from a UID not allowed (--metrics-allowed-uids)');
          refusedLogged ||= !ok;
          return ok;
        });
        peerOk.set(socket, decision);
      });
      const serve = (req: IncomingMessage, res: ServerResponse): void => {
        const path = (req.url ?? '').split('?')[0];
        if (!checkHost(req.headers.host, port).ok) return answer(res, 403, 'forbidden host\n');
        if (path !== '/metrics') return answer(res, 404, 'not found: the metrics are at /metrics\n');
        if (req.method !== 'GET' && req.method !== 'HEAD') return answer(res, 405, 'method not allowed\n', { allow: 'GET, HEAD' });
        options.registry.metrics().then(
          (text) => {
            res.writeHead(200, { 'content-type': options.registry.contentType, 'cache-control': 'no-store' });
            res.end(req.method === 'HEAD' ? undefined : text);
          },
          (err: unknown) => {
            log.warn({ err: { message: (err as Error).message } }, 'metrics collection failed');
            answer(res, 500, 'metrics collection failed\n');
          },
        );
      };
      let bound: AddressInfo;
      try {
        bound = await listen(server, options.listen);
      } catch (err) {
        await close();
        throw err;
      }
      port = bound.port;
      log.info({ address: bound.address, port: bound.port }, 'metrics listening');
      options.onListening?.(bound.port);
      await new Promise<void>((resolve) => {
        if (signal.aborted) resolve();
        else signal.addEventListener('abort', () => resolve(), { once: true });
      });
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await close();
    },
  };
}

function answer(res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', ...headers });
  res.end(text);
}
