/**
 * The real-MCP bench's server, run as its own process
 * (`node build/bench/mcp-server.js stateful,stateless,…`, one word per port): the MCP SDK's
 * StreamableHTTPServerTransport on loopback ports (one per peer, as bench/upstream.ts
 * does). Stateful: one session per client, found by `Mcp-Session-Id`. Stateless: a fresh
 * server and transport per request (the SDK's way), for a peer that does not carry the
 * session header (the cli-proxy's answer headers are the CLI whitelist). Each port serves
 *   /sse    answers framed as SSE (the SDK's default)
 *   /json   answers as one JSON body (enableJsonResponse)
 * with one tool, `echo`, answering its `text` argument. Every request must carry
 * `Authorization: Bearer $BENCH_MCP_TOKEN` (else 401): a peer that drops the injected
 * header fails the run instead of being measured doing less. Prints {"ports":[…]} on
 * stdout once listening.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const modes = (process.argv[2] ?? 'stateful').split(',');
const expected = `Bearer ${process.env.BENCH_MCP_TOKEN ?? ''}`;
const sessions = new Map<string, StreamableHTTPServerTransport>();

function mcpServer(): Server {
  const server = new Server({ name: 'bench-mcp', version: '1.0.0' }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: [{ name: 'echo', description: 'answers its text', inputSchema: { type: 'object', properties: { text: { type: 'string' } } } }],
  }));
  server.setRequestHandler(CallToolRequestSchema, (req) => ({
    content: [{ type: 'text', text: String(req.params.arguments?.text ?? '') }],
  }));
  return server;
}

async function handle(stateful: boolean, req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (req.headers.authorization !== expected) {
    res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"unauthorized"}');
    return;
  }
  const path = (req.url ?? '/').split('?')[0];
  if (path !== '/sse' && path !== '/json') {
    res.writeHead(404).end();
    return;
  }
  if (!stateful) {
    const t = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: path === '/json' });
    await mcpServer().connect(t);
    res.once('close', () => void t.close());
    await t.handleRequest(req, res);
    return;
  }
  const id = req.headers['mcp-session-id'];
  let transport = typeof id === 'string' ? sessions.get(id) : undefined;
  if (transport === undefined) {
    if (typeof id === 'string' || req.method !== 'POST') {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}');
      return;
    }
    const t = new StreamableHTTPServerTransport({
      sessionIdGenerator: randomUUID,
      enableJsonResponse: path === '/json',
      onsessioninitialized: (sid) => void sessions.set(sid, t),
      onsessionclosed: (sid) => void sessions.delete(sid),
    });
    await mcpServer().connect(t);
    transport = t;
  }
  await transport.handleRequest(req, res);
}

const ports: number[] = [];
for (const mode of modes) {
  const srv = createServer({ noDelay: true, keepAliveTimeout: 60_000 }, (req, res) => {
    handle(mode === 'stateful', req, res).catch((err: unknown) => {
      process.stderr.write(`bench mcp server: ${err instanceof Error ? err.message : String(err)}\n`);
      if (!res.headersSent) res.writeHead(500).end();
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  ports.push((srv.address() as AddressInfo).port);
}
process.stdout.write(`${JSON.stringify({ ports })}\n`);
process.on('SIGTERM', () => process.exit(0));
