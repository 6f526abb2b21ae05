/**
 * The benchmark's upstream, run as its own process (`node build/bench/upstream.js N`):
 * one node:http server per peer on N loopback ports (so no peer's TIME_WAIT sockets
 * or load leak into another's), each serving
 *   POST /mcp                  1 KB JSON answer to a 1 KB JSON request
 *   GET  /sse?interval&count&pad[&ack=1]
 *                              SSE, each event carrying its send time (hrtime, ns; the
 *                              monotonic clock is shared by all processes). With ack=1
 *                              event n+1 is sent only after GET /ack?s=<id>&n=<n>.
 *   GET  /big?bytes=N          N bytes of the pattern, written with backpressure
 *   GET  /idle                 SSE headers, then silence until the client leaves
 *   GET  /stats                per-port counters (JSON)
 * Prints {"ports":[…],"pid":…} on stdout once listening.
 */
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { BLOCK_SIZE, patternBlock } from './lib/pattern.js';
import { JSON_RESPONSE, sseEventText, type PortStats, type UpstreamHello } from './lib/wire.js';

const count = Number(process.argv[2] ?? '1');
const block = patternBlock();
const stats = new Map<number, PortStats>();
const ackWaiters = new Map<string, { acked: number; wake?: () => void }>();
let streamSeq = 0;

const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };

function intParam(url: URL, name: string, def: number): number {
  const v = url.searchParams.get(name);
  return v === null ? def : Number(v);
}

function handle(port: number, req: IncomingMessage, res: ServerResponse): void {
  const st = stats.get(port) as PortStats;
  st.requests++;
  const url = new URL(req.url ?? '/', 'http://upstream');
  switch (url.pathname) {
    case '/mcp':
      req.resume();
      req.once('end', () => {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': JSON_RESPONSE.length });
        res.end(JSON_RESPONSE);
      });
      return;
    case '/sse':
      void sse(st, url, res);
      return;
    case '/ack': {
      const w = ackWaiters.get(url.searchParams.get('s') ?? '');
      if (w) {
        w.acked = Math.max(w.acked, intParam(url, 'n', -1));
        w.wake?.();
      }
      res.writeHead(204).end();
      return;
    }
    case '/big':
      void big(st, intParam(url, 'bytes', 0), res);
      return;
    case '/idle':
      st.idleOpen++;
      res.writeHead(200, SSE_HEADERS);
      res.flushHeaders();
      res.once('close', () => st.idleOpen--);
      return;
    case '/stats':
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(Object.fromEntries(stats)));
      return;
    default:
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"not_found"}');
  }
}

async function sse(st: PortStats, url: URL, res: ServerResponse): Promise<void> {
  const interval = intParam(url, 'interval', 10);
  const total = intParam(url, 'count', 100);
  const pad = 'p'.repeat(intParam(url, 'pad', 100));
  const ack = url.searchParams.get('ack') === '1';
  const sid = `s${++streamSeq}`;
  const waiter: { acked: number; wake?: () => void } = { acked: -1 };
  ackWaiters.set(sid, waiter);
  st.sseOpen++;
  let closed = false;
  res.once('close', () => {
    closed = true;
    waiter.wake?.();
  });
  res.writeHead(200, SSE_HEADERS);
  res.flushHeaders();
  try {
    // Independent streams: each starts at a random phase of its interval.
    if (!ack) await new Promise((r) => setTimeout(r, Math.random() * interval));
    let next = performance.now();
    for (let n = 0; n < total && !closed; n++) {
      if (ack && n > 0) {
        while (waiter.acked < n - 1 && !closed) await new Promise<void>((r) => (waiter.wake = r));
        if (closed) break;
      }
      const text = sseEventText({ s: sid, n, t: process.hrtime.bigint().toString(), a: waiter.acked }, pad);
      res.write(text);
      if (!ack) {
        next += interval;
        const wait = next - performance.now();
        await new Promise((r) => setTimeout(r, Math.max(0, wait)));
      }
    }
    if (!closed) res.end();
  } finally {
    st.sseOpen--;
    ackWaiters.delete(sid);
  }
}

async function big(st: PortStats, bytes: number, res: ServerResponse): Promise<void> {
  st.bigWritten = 0;
  st.bigDone = false;
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': bytes });
  const closed = once(res, 'close');
  let sent = 0;
  while (sent < bytes) {
    const n = Math.min(BLOCK_SIZE, bytes - sent); // offsets stay block-aligned
    const ok = res.write(n === BLOCK_SIZE ? block : block.subarray(0, n));
    sent += n;
    st.bigWritten = sent;
    if (!ok) {
      await Promise.race([once(res, 'drain'), closed]);
      if (res.destroyed) return;
    }
  }
  res.end();
  st.bigDone = true;
}

async function main(): Promise<void> {
  const ports: number[] = [];
  for (let i = 0; i < count; i++) {
    let port = 0;
    const server = createServer({ noDelay: true, keepAliveTimeout: 120_000, requestTimeout: 0, headersTimeout: 60_000 }, (req, res) =>
      handle(port, req, res),
    );
    server.maxRequestsPerSocket = 0;
    server.on('connection', (socket: Socket) => {
      const st = stats.get(port);
      if (!st) return;
      st.connections++;
      socket.once('close', () => st.connections--);
    });
    server.timeout = 0;
    server.listen(0, '127.0.0.1', 4096);
    await once(server, 'listening');
    port = (server.address() as AddressInfo).port;
    stats.set(port, { requests: 0, bigWritten: 0, bigDone: false, idleOpen: 0, sseOpen: 0, connections: 0 });
    ports.push(port);
  }
  const hello: UpstreamHello = { ports, pid: process.pid };
  process.stdout.write(`${JSON.stringify(hello)}\n`);
}

void main();
