import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Wakeups } from './wakeups.js';

/** One request as the Gateway saw it. */
export interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  rawHeaders: string[];
  body: Buffer;
  /** Resolves when the forwarder's side of this request/response went away before the end. */
  aborted: Promise<void>;
  wasAborted: () => boolean;
}

export type GatewayHandler = (req: SeenRequest, res: ServerResponse) => void | Promise<void>;

/**
 * A faithful stand-in for the cloud Gateway (not our code, so a mock is fair): records
 * every request, answers as each test scripts it (JSON, SSE with controlled timing,
 * arbitrary status and headers, hangs) and notices aborts.
 */
export class MockGateway {
  readonly requests: SeenRequest[] = [];
  private handler: GatewayHandler = (_req, res) => json(res, 200, { jsonrpc: '2.0', id: 1, result: {} });
  private server: Server;
  private sockets = new Set<Socket>();
  private readonly arrivals = new Wakeups();
  port = 0;

  constructor() {
    this.server = createServer((req, res) => void this.onRequest(req, res));
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
  }

  static async start(): Promise<MockGateway> {
    const gw = new MockGateway();
    gw.server.listen(0, '127.0.0.1');
    await once(gw.server, 'listening');
    gw.port = (gw.server.address() as AddressInfo).port;
    return gw;
  }

  url(path = '/mcp'): string {
    return `http://127.0.0.1:${this.port}${path}`;
  }

  handle(fn: GatewayHandler): void {
    this.handler = fn;
  }

  /** Resolves once at least `n` requests have been seen. */
  async waitForRequests(n: number): Promise<SeenRequest> {
    while (this.requests.length < n) await this.arrivals.next();
    return this.requests[n - 1] as SeenRequest;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    let aborted = false;
    let resolveAborted!: () => void;
    const abortedP = new Promise<void>((r) => (resolveAborted = r));
    res.on('close', () => {
      if (!res.writableFinished) {
        aborted = true;
        resolveAborted();
      }
    });
    const seen: SeenRequest = {
      method: req.method ?? '',
      url: req.url ?? '',
      headers: req.headers,
      rawHeaders: req.rawHeaders,
      body: Buffer.concat(chunks),
      aborted: abortedP,
      wasAborted: () => aborted,
    };
    this.requests.push(seen);
    this.arrivals.wake();
    try {
      await this.handler(seen, res);
    } catch {
      res.destroy();
    }
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

export function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string | string[]> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

/** Opens an SSE response and hands back a sender the test drives event by event. */
export function sse(res: ServerResponse, headers: Record<string, string> = {}): { send: (data: string) => void; end: () => void } {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', ...headers });
  res.flushHeaders();
  return {
    send: (data) => {
      res.write(data);
    },
    end: () => res.end(),
  };
}
