import { once } from 'node:events';
import { createServer, type RequestListener, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/**
 * The HTTP server under every test mock (Gateways, upstreams): 127.0.0.1, a port the
 * kernel picks, and a close() that does not wait for the clients under test. Every
 * socket is tracked and destroyed on close, upgraded or hanging ones included, because a
 * mock that holds a stream open on purpose would otherwise keep server.close() waiting
 * until the test times out.
 */
export class LoopbackServer {
  private readonly server: Server;
  private readonly sockets = new Set<Socket>();
  private listeningPort = 0;

  constructor(handler: RequestListener) {
    this.server = createServer(handler);
    this.server.on('connection', (s: Socket) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
  }

  /** Resolves with the port once the server listens. */
  async listen(): Promise<number> {
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    this.listeningPort = (this.server.address() as AddressInfo).port;
    return this.listeningPort;
  }

  /** 0 until listen() resolves. */
  get port(): number {
    return this.listeningPort;
  }

  /** `http://127.0.0.1:<port><path>` */
  url(path = ''): string {
    return `http://127.0.0.1:${this.listeningPort}${path}`;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}
