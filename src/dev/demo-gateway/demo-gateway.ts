import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import type { Logger } from '../../log/logger.js';
import type { RenewAuthority } from './authority.js';
import { handleDemoControlHttp, isDemoApiSlot, type DemoConnections } from './demo-control.js';
import { handleRenewHttp } from './gateway-http.js';
import type { HostControl } from './host-control.js';
import { handleHostHttp } from './host-http.js';

/**
 * The built-in demo Gateway for `agent-connectors dev`: a real MCP server (official SDK,
 * stateful Streamable HTTP) behind bearer-token auth, standing in for the cloud Gateway.
 * Its tokens come from the renewal endpoint (SPEC §4), so the demo shows renewal rotating
 * tokens under a live agent session, and injection working end to end.
 */
export class DemoGateway {
  private readonly sessions = new Map<string, StreamableHTTPServerTransport>();
  private readonly server = createServer((req, res) => void this.onRequest(req, res));
  port = 0;
  /** The demo platform's connect/disconnect surface (`/demo`), once dev has made it. */
  private connections: DemoConnections | undefined;

  constructor(
    private readonly log: Logger,
    /** Mints and checks tokens, and serves the renewal endpoint of SPEC §4. */
    readonly authority: RenewAuthority,
    /** Enrolment, desired state and presence (SPEC §8); absent, those paths answer 404. */
    readonly hostControl?: HostControl,
  ) {}

  async listen(port = 0): Promise<number> {
    this.server.listen(port, '127.0.0.1');
    await once(this.server, 'listening');
    this.port = (this.server.address() as AddressInfo).port;
    return this.port;
  }

  /** Serves `/demo` (the page and the control requests) for these connections. */
  serveDemoControl(connections: DemoConnections): void {
    this.connections = connections;
  }

  get mcpUrl(): string {
    return `http://127.0.0.1:${this.port}/mcp`;
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  private async readJson(req: IncomingMessage): Promise<unknown> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (chunks.length === 0) return undefined;
    return JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (await handleRenewHttp(this.authority, req, res)) return;
    if (this.hostControl && (await handleHostHttp(this.hostControl, req, res))) return;
    if (this.connections && handleDemoControlHttp(this.connections, req, res, this.port)) return;
    const url = new URL(req.url ?? '/', 'http://gateway');
    if (url.pathname.startsWith('/api/demo/')) return this.demoApi(req, res, url);
    if (url.pathname !== '/mcp') return reply(res, 404, { error: 'not_found' });
    const auth = req.headers.authorization ?? '';
    const tokenId = auth.startsWith('Bearer ') ? this.authority.isValidToken(auth.slice(7))?.tokenId : undefined;
    if (!tokenId) {
      // A real gateway would send this; the forwarder must never pass it on to the agent.
      return reply(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token"' });
    }
    try {
      const body = req.method === 'POST' ? await this.readJson(req) : undefined;
      const sid = req.headers['mcp-session-id'];
      const sessionId = Array.isArray(sid) ? sid[0] : sid;
      let transport = sessionId ? this.sessions.get(sessionId) : undefined;
      if (!transport) {
        if (sessionId) return reply(res, 404, { jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null });
        if (req.method !== 'POST' || !isInitializeRequest(body)) {
          return reply(res, 400, { jsonrpc: '2.0', error: { code: -32000, message: 'No valid session id' }, id: null });
        }
        const t: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (id) => {
            this.sessions.set(id, t);
            this.log.info({ session: id.slice(0, 8) }, 'demo gateway: session opened');
          },
        });
        t.onclose = () => {
          if (t.sessionId) this.sessions.delete(t.sessionId);
        };
        await this.createMcpServer().connect(t);
        transport = t;
      }
      const handling = transport;
      await this.requestToken.run(tokenId, () => handling.handleRequest(req, res, body));
    } catch (err) {
      this.log.warn({ err: { message: (err as Error).message } }, 'demo gateway: request failed');
      if (!res.headersSent) reply(res, 400, { jsonrpc: '2.0', error: { code: -32700, message: 'Parse error' }, id: null });
    }
  }

  /**
   * The demo provider's REST API for the shell CLI (`acdemo`), reached through the
   * cli-proxy, which injects the `cli:demo` token.
   */
  private demoApi(req: IncomingMessage, res: ServerResponse, url: URL): void {
    const auth = req.headers.authorization ?? '';
    const valid = auth.startsWith('Bearer ') ? this.authority.isValidToken(auth.slice(7)) : undefined;
    if (!valid || !isDemoApiSlot(valid.slot)) return reply(res, 401, { error: 'invalid_token' });
    if (url.pathname === '/api/demo/whoami') return reply(res, 200, { provider: 'demo', tokenId: valid.tokenId });
    if (url.pathname === '/api/demo/items') {
      const q = url.searchParams.get('q') ?? '';
      const items = ['meeting notes', 'roadmap', 'release checklist', 'on-call handbook'].filter((i) => i.includes(q));
      return reply(res, 200, { items });
    }
    return reply(res, 404, { error: 'not_found' });
  }

  /** The token id of the request being served (whoami reports it; never the token). */
  private readonly requestToken = new AsyncLocalStorage<string>();

  private createMcpServer(): McpServer {
    const server = new McpServer({ name: 'agent-connectors-demo', version: '1.0.0' }, { capabilities: { logging: {} } });
    server.registerTool(
      'echo',
      { description: 'Echo a message back', inputSchema: { message: z.string() } },
      async ({ message }) => ({ content: [{ type: 'text', text: message }] }),
    );
    server.registerTool(
      'add',
      { description: 'Add two numbers', inputSchema: { a: z.number(), b: z.number() } },
      async ({ a, b }) => ({ content: [{ type: 'text', text: String(a + b) }] }),
    );
    server.registerTool(
      'whoami',
      { description: 'Which token id the gateway saw (never the token itself); shows renewal at work' },
      async () => ({ content: [{ type: 'text', text: JSON.stringify({ tokenId: this.requestToken.getStore() ?? null, at: new Date().toISOString() }) }] }),
    );
    server.registerTool(
      'count',
      {
        description: 'Count to n, streaming a progress notification per step over SSE',
        inputSchema: { n: z.number().int().min(1).max(100), delayMs: z.number().int().min(0).max(5000).default(200) },
      },
      async ({ n, delayMs }, extra) => {
        for (let i = 1; i <= n; i++) {
          if (extra.signal.aborted) return { content: [{ type: 'text', text: `cancelled at ${i}` }], isError: true };
          const progressToken = extra._meta?.progressToken;
          if (progressToken !== undefined) {
            await extra.sendNotification({
              method: 'notifications/progress',
              params: { progressToken, progress: i, total: n, message: `step ${i}/${n}` },
            });
          }
          await new Promise((r) => setTimeout(r, delayMs));
        }
        return { content: [{ type: 'text', text: `counted to ${n}` }] };
      },
    );
    return server;
  }

  async close(): Promise<void> {
    this.hostControl?.close();
    for (const t of this.sessions.values()) await t.close().catch(() => undefined);
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

function reply(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}
