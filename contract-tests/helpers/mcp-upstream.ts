import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';
import { LoopbackServer } from '../../test/support/loopback-server.js';

/** What a token check decided: accepted, or refused and why (never the token itself). */
export type TokenVerdict = { ok: true; tokenId?: string } | { ok: false; problem: string };

/** The tools a session can offer. */
export type McpTool = 'echo' | 'progress';

export interface McpUpstreamOptions {
  /**
   * Decides each request's bearer token (undefined without `Authorization: Bearer`), on
   * arrival, before the body is read: the moment a Gateway would check it. `true` or
   * `{ ok: true }` serves the request; anything else is answered 401.
   */
  check: (token: string | undefined) => boolean | TokenVerdict;
  /** The tools every session registers (default: all of them). */
  tools?: readonly McpTool[];
}

/** One HTTP request as the MCP upstream saw it. */
export interface McpSeen {
  method: string;
  /** The bearer token it carried (undefined without `Authorization: Bearer`). */
  token: string | undefined;
  /** Whether the check accepted the token. */
  valid: boolean;
  /** The accepted token's id, if the check named one. */
  tokenId?: string;
  /** Why the check refused the token. */
  problem?: string;
  sessionId: string | undefined;
  /** JSON-RPC method (first message of a POST), if any. */
  rpcMethod: string | undefined;
  /** What the upstream answered (set when the answer finished or the request closed). */
  status?: number;
}

/** The token of an `Authorization: Bearer <token>` header, else undefined. */
export function bearerToken(header: string | undefined): string | undefined {
  return header?.startsWith('Bearer ') ? header.slice('Bearer '.length) : undefined;
}

function rpcMethodOf(body: unknown): string | undefined {
  const first: unknown = Array.isArray(body) ? body[0] : body;
  if (first && typeof first === 'object' && 'method' in first && typeof first.method === 'string') return first.method;
  return undefined;
}

/**
 * A real MCP server (the official SDK's `McpServer` behind a stateful
 * `StreamableHTTPServerTransport`, one per session, kept in a map keyed by
 * `mcp-session-id`) acting as the Gateway. It serves only requests whose bearer token
 * `options.check` accepts (401 otherwise, as a Gateway would) and records every request
 * it saw.
 */
export class McpUpstream {
  readonly seen: McpSeen[] = [];
  readonly sessions = new Map<string, StreamableHTTPServerTransport>();
  private readonly servers: McpServer[] = [];
  private readonly http: LoopbackServer;

  private constructor(private readonly options: McpUpstreamOptions) {
    this.http = new LoopbackServer((req, res) => {
      this.onRequest(req, res).catch(() => res.destroy());
    });
  }

  static async start(options: McpUpstreamOptions): Promise<McpUpstream> {
    const up = new McpUpstream(options);
    await up.http.listen();
    return up;
  }

  get port(): number {
    return this.http.port;
  }

  url(path = '/mcp'): string {
    return this.http.url(path);
  }

  private newSession(): StreamableHTTPServerTransport {
    const server = new McpServer({ name: 'mock-gateway-mcp', version: '1.0.0' });
    const tools = this.options.tools ?? ['echo', 'progress'];
    if (tools.includes('echo')) {
      server.registerTool(
        'echo',
        { description: 'echoes its text', inputSchema: { text: z.string() } },
        ({ text }) => ({ content: [{ type: 'text', text: `echo: ${text}` }] }),
      );
    }
    if (tools.includes('progress')) {
      server.registerTool(
        'progress',
        { description: 'reports progress, then answers', inputSchema: { steps: z.number().int().positive() } },
        async ({ steps }, extra) => {
          const progressToken = extra._meta?.progressToken;
          for (let i = 1; i <= steps; i++) {
            if (progressToken !== undefined) {
              await extra.sendNotification({
                method: 'notifications/progress',
                params: { progressToken, progress: i, total: steps, message: `step ${i}` },
              });
            }
          }
          return { content: [{ type: 'text', text: `done after ${steps} steps` }] };
        },
      );
    }
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        this.sessions.set(id, transport);
      },
    });
    transport.onclose = () => {
      if (transport.sessionId) this.sessions.delete(transport.sessionId);
    };
    this.servers.push(server);
    void server.connect(transport);
    return transport;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const token = bearerToken(req.headers.authorization);
    // Checked on arrival, before the body: the moment the Gateway would check it.
    const checked = this.options.check(token);
    const verdict: TokenVerdict = typeof checked === 'boolean' ? (checked ? { ok: true } : { ok: false, problem: 'refused' }) : checked;
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks).toString('utf8');
    let parsed: unknown;
    if (raw.length > 0) {
      try {
        parsed = JSON.parse(raw) as unknown;
      } catch {
        parsed = undefined;
      }
    }
    const sessionHeader = req.headers['mcp-session-id'];
    const sessionId = Array.isArray(sessionHeader) ? sessionHeader[0] : sessionHeader;
    const seen: McpSeen = { method: req.method ?? '', token, valid: verdict.ok, sessionId, rpcMethod: rpcMethodOf(parsed) };
    if (verdict.ok && verdict.tokenId !== undefined) seen.tokenId = verdict.tokenId;
    this.seen.push(seen);
    res.once('close', () => {
      seen.status = res.statusCode;
    });

    if (!verdict.ok) {
      seen.problem = verdict.problem;
      const body = JSON.stringify({ error: 'invalid_token' });
      res.writeHead(401, {
        'content-type': 'application/json',
        'www-authenticate': 'Bearer error="invalid_token", resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource"',
      });
      res.end(body);
      return;
    }
    let transport: StreamableHTTPServerTransport | undefined;
    if (sessionId) {
      transport = this.sessions.get(sessionId);
      if (!transport) {
        const body = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } });
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(body);
        return;
      }
    } else {
      transport = this.newSession();
    }
    await transport.handleRequest(req, res, parsed);
  }

  async close(): Promise<void> {
    await Promise.all(this.servers.map((s) => s.close().catch(() => undefined)));
    await this.http.close();
  }
}
