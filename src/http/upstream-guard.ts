import type { Socket } from 'node:net';
import type { buildConnector } from 'undici';
import { AppError } from '../errors.js';
import type { Logger } from '../log/logger.js';
import { isLoopbackAddress, isLoopbackHostname } from '../net/loopback-address.js';
import type { PeerUidLookup } from './peer-uid.js';

/**
 * Where a token (the forwarder's, the cli-proxy's) or the host credential (the link's)
 * may go, decided once per new connection, never per request:
 *
 * - Not to one of this host's own listeners (a Gateway-given upstream at the forwarder's
 *   own port turned one request into 15 000 sockets): refused before any socket exists.
 * - Over plain http only to a loopback listener whose owner the kernel names as root, our
 *   own UID or one the operator listed (`--loopback-owner-uids`), and never an agent's: any
 *   local user can bind the free port of a stopped loopback upstream and read what is sent
 *   there. Checked on the connected socket before undici writes a byte to it.
 *
 * https is not checked for its owner: TLS proves who answers.
 */
export interface UpstreamGuardOptions {
  /** `upstream` or `gateway`: what the log lines call the far end. */
  what: string;
  /** The owner of the listener a connection of ours reached (peer-uid.ts), chosen on first use. */
  listenerOwner: () => Promise<PeerUidLookup>;
  /** UIDs besides root and our own whose loopback listeners may receive a token (`--loopback-owner-uids`). */
  ownerUids?: ReadonlySet<number> | undefined;
  /** Agent UIDs are never trusted, even when listed; asked at each check (the agent-users file is watched). */
  isAgent?: ((uid: number) => boolean) | undefined;
  /** This host's own listener ports; asked at each check (a port 0 is known only once bound). */
  reservedPorts?: (() => Iterable<number>) | undefined;
  log?: Logger | undefined;
}

const DEFAULT_PORTS: Record<string, number> = { 'http:': 80, 'https:': 443 };

export class UpstreamGuard {
  private readonly own = process.getuid?.();

  constructor(private readonly options: UpstreamGuardOptions) {}

  private reserved(port: number): boolean {
    for (const p of this.options.reservedPorts?.() ?? []) if (p === port) return true;
    return false;
  }

  /** Before connecting: a target that is one of our own listeners is refused without a socket. */
  beforeConnect(protocol: string, hostname: string, port: string | number): AppError | undefined {
    const n = port === '' || port === undefined ? (DEFAULT_PORTS[protocol] ?? 0) : Number(port);
    if (!isLoopbackHostname(hostname) || !this.reserved(n)) return undefined;
    this.options.log?.error({ port: n }, `${this.options.what} is one of this host's own listeners; refused, no connection made`);
    return new AppError('upstream_loop');
  }

  /** After connecting, before anything is written: where the socket really landed, and who listens there. */
  async afterConnect(protocol: string, socket: Socket): Promise<AppError | undefined> {
    const { remoteAddress = '', remotePort = 0, localAddress = '', localPort = 0 } = socket;
    const { log, what } = this.options;
    // A name that resolved to loopback: the address, not the URL, says where we are.
    if (isLoopbackAddress(remoteAddress) && this.reserved(remotePort)) {
      log?.error({ port: remotePort }, `${what} is one of this host's own listeners; refused, nothing sent`);
      return new AppError('upstream_loop');
    }
    if (protocol !== 'http:') return undefined;
    if (!isLoopbackAddress(remoteAddress)) {
      log?.error({ port: remotePort }, `plain http ${what} is not on loopback; refused, nothing sent`);
      return new AppError('upstream_untrusted');
    }
    const uid = await (await this.options.listenerOwner())(remoteAddress, remotePort, localAddress, localPort);
    if (uid !== undefined && this.trusted(uid)) return undefined;
    log?.error(
      { port: remotePort, uid: uid ?? null },
      uid === undefined
        ? `${what} listener's owner unknown (the kernel did not say); refused, nothing sent`
        : `${what} listener not trusted (not root, this service's user or --loopback-owner-uids; or an agent user); refused, nothing sent`,
    );
    return new AppError('upstream_untrusted');
  }

  /** Root and our own UID always (an agent of our own UID already reads what we read); listed UIDs unless an agent's. */
  trusted(uid: number): boolean {
    if (uid === 0 || uid === this.own) return true;
    return (this.options.ownerUids?.has(uid) ?? false) && !(this.options.isAgent?.(uid) ?? false);
  }
}

/**
 * undici's connector with the guard around it: the request's socket reaches undici only
 * once the guard has passed it, so a refused one never carries a byte. The refusal is an
 * AppError (not an undici socket error, which undici would retry with a new connection).
 */
export function guardedConnector(connector: buildConnector.connector, guard: UpstreamGuard | undefined, onSocket?: (socket: Socket) => void): buildConnector.connector {
  return (opts, callback) => {
    const early = guard?.beforeConnect(opts.protocol, opts.hostname, opts.port);
    if (early) {
      callback(early, null);
      return;
    }
    connector(opts, (err, socket) => {
      if (err || !socket) {
        callback(err ?? new Error('no socket'), null);
        return;
      }
      if (!guard) {
        onSocket?.(socket);
        callback(null, socket);
        return;
      }
      guard.afterConnect(opts.protocol, socket).then(
        (refused) => {
          if (refused) {
            socket.destroy();
            callback(refused, null);
          } else {
            onSocket?.(socket);
            callback(null, socket);
          }
        },
        () => {
          // No answer is no trust.
          socket.destroy();
          callback(new AppError('upstream_untrusted'), null);
        },
      );
    });
  };
}
