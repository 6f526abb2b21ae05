import { createServer, type Server, type Socket } from 'node:net';
import type { Logger } from '../log/logger.js';

/**
 * Extra loopback ports a part serves besides its own (the cli-proxy's provider ports,
 * SPEC §10). Each accepted socket is handed to the part's one HTTP server, so it passes
 * the same connection limits, peer check and audit as a connection to the main port;
 * `portOf` tells the handler which side port a request came in on. The set follows the
 * config: `sync` after every good load opens the new ports and closes the dropped ones.
 * A port that cannot be bound (taken) is logged and tried again on the next load; the
 * other ports and the main one keep serving.
 */
export class SideListeners {
  private readonly servers = new Map<number, Server>();
  private readonly ports = new WeakMap<Socket, number>();
  private queue: Promise<void> = Promise.resolve();

  constructor(
    private readonly host: string,
    private readonly onSocket: (socket: Socket) => void,
    private readonly log: Logger,
  ) {}

  /** The side port `socket` was accepted on, or undefined for the main listener's. */
  portOf(socket: Socket): number | undefined {
    return this.ports.get(socket);
  }

  /** Serially: a reload while the previous one still binds waits its turn. */
  sync(wanted: ReadonlySet<number>): Promise<void> {
    this.queue = this.queue.then(() => this.apply(wanted));
    return this.queue;
  }

  close(): Promise<void> {
    return this.sync(new Set());
  }

  private async apply(wanted: ReadonlySet<number>): Promise<void> {
    for (const [port, server] of [...this.servers]) {
      if (wanted.has(port)) continue;
      this.servers.delete(port);
      // Stops accepting; connections already handed over belong to the HTTP server's drain.
      server.close();
      this.log.info({ port }, 'provider port closed');
    }
    for (const port of wanted) {
      if (this.servers.has(port)) continue;
      const server = createServer((socket) => {
        this.ports.set(socket, port);
        this.onSocket(socket);
      });
      try {
        await new Promise<void>((resolve, reject) => {
          server.once('error', reject);
          server.listen({ host: this.host, port, exclusive: true }, () => {
            server.off('error', reject);
            resolve();
          });
        });
        this.servers.set(port, server);
        this.log.info({ address: this.host, port }, 'provider port listening');
      } catch (err) {
        this.log.error({ port, error: (err as NodeJS.ErrnoException).code ?? String(err) }, 'provider port could not be bound; its provider is served on /p/ only until the next catalog load');
      }
    }
  }
}
