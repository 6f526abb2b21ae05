/**
 * The Node floor, a bench peer: the least a Node proxy of the forwarder's shape can do.
 * node:http server, undici's dispatch-handler interface to a keep-alive pool (the fastest
 * undici path), the request body buffered, body chunks written straight to the response,
 * one Authorization header: fixed, or with `--token-file F` read from F on every request
 * (the real-MCP scenario: a token that can rotate, the least a secret-holding proxy does).
 * The MCP session headers pass both ways. No header filtering, no access log, no
 * Host/Origin checks, no limits: what the forwarder costs above this is what its
 * behaviour (SPEC §3) costs.
 * `node build/bench/floor-proxy.js <upstream-port> [--token-file F] --listen host:port`.
 */
import { readFileSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import { Agent, type Dispatcher } from 'undici';

const upstreamPort = Number(process.argv[2]);
const listenArg = process.argv[process.argv.indexOf('--listen') + 1] ?? '127.0.0.1:0';
const [host, port] = listenArg.split(':');
const tokenFileAt = process.argv.indexOf('--token-file');
const tokenFile = tokenFileAt > 0 ? process.argv[tokenFileAt + 1] : undefined;
const origin = `http://127.0.0.1:${upstreamPort}`;
const authorization = (): string => (tokenFile === undefined ? 'Bearer fixed' : `Bearer ${readFileSync(tokenFile, 'utf8').trim()}`);
const agent = new Agent({ keepAliveTimeout: 4_000, pipelining: 1, bodyTimeout: 0 });

class Relay implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | undefined;
  constructor(private readonly res: ServerResponse) {
    res.once('close', () => {
      if (!res.writableFinished) this.controller?.abort(new Error('client left'));
    });
    res.on('drain', () => this.controller?.resume());
  }
  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
  }
  onResponseStart(_c: Dispatcher.DispatchController, status: number, headers: Record<string, string | string[] | undefined>): void {
    const out: Record<string, string> = {};
    for (const name of ['content-type', 'content-length', 'mcp-session-id']) {
      const v = headers[name];
      if (typeof v === 'string') out[name] = v;
    }
    this.res.writeHead(status, out);
    if (out['content-type'] === 'text/event-stream') this.res.flushHeaders();
  }
  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (!this.res.write(chunk)) controller.pause();
  }
  onResponseEnd(): void {
    this.res.end();
  }
  onResponseError(): void {
    if (this.res.headersSent) this.res.destroy();
    else this.res.writeHead(502).end();
  }
}

createServer({ noDelay: true, keepAliveTimeout: 5_000 }, (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const body = chunks.length === 0 ? null : Buffer.concat(chunks);
    const headers: Record<string, string> = { 'content-type': req.headers['content-type'] ?? 'application/json', accept: req.headers.accept ?? '*/*', authorization: authorization() };
    for (const name of ['mcp-session-id', 'mcp-protocol-version']) {
      const v = req.headers[name];
      if (typeof v === 'string') headers[name] = v;
    }
    agent.dispatch({ origin, path: req.url ?? '/', method: (req.method ?? 'GET') as Dispatcher.HttpMethod, headers, body }, new Relay(res));
  });
}).listen(Number(port), host);

// A clean exit on SIGTERM, so `--cpu-prof` gets to write its profile.
process.on('SIGTERM', () => process.exit(0));
