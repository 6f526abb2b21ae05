/**
 * The Node floor, a bench peer: the least a Node proxy of the forwarder's shape can do.
 * node:http server, undici's dispatch-handler interface to a keep-alive pool (the fastest
 * undici path), the request body buffered, body chunks written straight to the response,
 * one fixed Authorization header. No token file, no header filtering, no access log, no
 * Host/Origin checks, no limits: what the forwarder costs above this is what its
 * behaviour (SPEC §3) costs. `node build/bench/floor-proxy.js <upstream-port> --listen host:port`.
 */
import { createServer, type ServerResponse } from 'node:http';
import { Agent, type Dispatcher } from 'undici';

const upstreamPort = Number(process.argv[2]);
const listenArg = process.argv[process.argv.indexOf('--listen') + 1] ?? '127.0.0.1:0';
const [host, port] = listenArg.split(':');
const origin = `http://127.0.0.1:${upstreamPort}`;
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
    for (const name of ['content-type', 'content-length']) {
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
    agent.dispatch(
      {
        origin,
        path: req.url ?? '/',
        method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
        headers: { 'content-type': req.headers['content-type'] ?? 'application/json', accept: req.headers.accept ?? '*/*', authorization: 'Bearer fixed' },
        body,
      },
      new Relay(res),
    );
  });
}).listen(Number(port), host);

// A clean exit on SIGTERM, so `--cpu-prof` gets to write its profile.
process.on('SIGTERM', () => process.exit(0));
