import type { IncomingMessage, ServerResponse } from 'node:http';
import { LoopbackServer } from './loopback-server.js';
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
  private readonly server: LoopbackServer;
  private readonly arrivals = new Wakeups();

  constructor() {
    this.server = new LoopbackServer((req, res) => void this.onRequest(req, res));
  }

  static async start(): Promise<MockGateway> {
    const gw = new MockGateway();
    await gw.server.listen();
    return gw;
  }

  get port(): number {
    return this.server.port;
  }

  url(path = '/mcp'): string {
    return this.server.url(path);
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
    await this.server.close();
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
