import { once } from 'node:events';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import t from 'tap';
import { createUpstreamAgent, UNUSED_CONNECTION_MS } from '../../src/http/upstream-agent.js';
import { UpstreamCall, type StreamOutcome, type UpstreamHead } from '../../src/http/upstream-call.js';
import { until } from '../support/poll.js';

/** A real upstream whose handler each test chooses; counts its open TCP connections. */
class Upstream {
  connections = 0;
  readonly sockets: Socket[] = [];
  readonly closed: string[] = [];
  private readonly server: Server;
  constructor(handler: (req: IncomingMessage, res: ServerResponse) => void) {
    this.server = createServer((req, res) => {
      res.once('close', () => this.closed.push(req.url ?? ''));
      handler(req, res);
    });
    this.server.on('connection', (s: Socket) => {
      this.connections++;
      this.sockets.push(s);
      s.once('close', () => this.connections--);
    });
  }
  async start(): Promise<string> {
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }
  stop(): void {
    this.server.closeAllConnections();
    this.server.close();
  }
}

type Decide = (call: UpstreamCall, head: UpstreamHead, res: ServerResponse) => Promise<StreamOutcome | 'answered'>;

/** The two headers these tests need passed through (the parts filter with their own policy). */
function passed(head: UpstreamHead): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of ['content-type', 'content-length']) {
    const v = head.headers[name];
    if (typeof v === 'string') out[name] = v;
  }
  return out;
}

/** The proxy side: one UpstreamCall per request, handled as `decide` says; outcomes recorded. */
async function startProxy(origin: string, decide?: Decide): Promise<{ port: number; outcomes: string[]; stop: () => void }> {
  const agent = createUpstreamAgent();
  const outcomes: string[] = [];
  const server = createServer((req, res) => {
    const call = new UpstreamCall(agent, { target: { origin, path: req.url ?? '/' }, method: req.method ?? 'GET', headers: {}, body: null }, res);
    call.head
      .then((head) => (decide ? decide(call, head, res) : call.pipe(head.statusCode, passed(head))))
      .then(
        (o) => outcomes.push(o),
        (err: unknown) => outcomes.push(`error:${(err as Error).name}`),
      );
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    outcomes,
    stop: () => {
      server.closeAllConnections();
      server.close();
      void agent.close();
    },
  };
}

/** Raw client: sends one request and collects every chunk it receives, as received. */
function rawGet(port: number, path: string): { socket: Socket; chunks: Buffer[]; text: () => string } {
  const socket = connect(port, '127.0.0.1');
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  socket.on('error', () => undefined);
  socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
  return { socket, chunks, text: () => Buffer.concat(chunks).toString('latin1') };
}

t.test('a JSON answer goes out byte for byte, headers and body in one write', async (t) => {
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, result: { text: 'x'.repeat(900) } });
  const up = new Upstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
  const proxy = await startProxy(await up.start());
  t.teardown(() => (proxy.stop(), up.stop()));
  const c = rawGet(proxy.port, '/json');
  await until(() => c.text().endsWith(body), 'the whole body');
  t.equal(c.chunks.length, 1, 'the agent received status, headers and body in a single segment');
  t.match(c.text(), /^HTTP\/1\.1 200 OK\r\n/);
  t.match(c.text(), /content-type: application\/json/);
  t.ok(c.text().endsWith(`\r\n\r\n${body}`), 'body unchanged');
  await until(() => proxy.outcomes.length === 1, 'outcome');
  t.same(proxy.outcomes, ['ok']);
  c.socket.destroy();
});

t.test('an SSE answer whose upstream stays silent still gives the agent its headers', async (t) => {
  const up = new Upstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders(); // and then nothing, until the client leaves
  });
  const proxy = await startProxy(await up.start());
  t.teardown(() => (proxy.stop(), up.stop()));
  const c = rawGet(proxy.port, '/idle');
  await until(() => c.text().includes('\r\n\r\n'), 'headers while the upstream is silent');
  t.match(c.text(), /^HTTP\/1\.1 200 OK\r\n[\s\S]*content-type: text\/event-stream/);
  t.notMatch(c.text(), /\r\n\r\n./, 'no body byte was invented');
  c.socket.destroy();
});

t.test('agents leaving SSE streams: the upstream sees each close and keeps no connection', async (t) => {
  const N = 6;
  const up = new Upstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: first\n\n');
  });
  const proxy = await startProxy(await up.start());
  t.teardown(() => (proxy.stop(), up.stop()));
  // One stream stays for the whole test, so the pool for this origin stays alive (undici
  // closes a pool, and its leftovers, once it has no connection at all).
  const stays = rawGet(proxy.port, '/sse/stays');
  await until(() => stays.text().includes('data: first'), 'the staying stream open');
  const clients = Array.from({ length: N }, (_, i) => rawGet(proxy.port, `/sse/${i}`));
  await until(() => clients.every((c) => c.text().includes('data: first')), 'every stream open');
  t.equal(up.connections, N + 1, 'one upstream connection per stream');
  // Resets, one by one, as agents leave.
  for (const c of clients) {
    c.socket.resetAndDestroy();
    await new Promise((r) => setTimeout(r, 30));
  }
  await until(() => up.closed.length === N, 'the upstream saw every left stream close');
  await until(() => proxy.outcomes.length === N, 'every call settled');
  t.same(proxy.outcomes, Array(N).fill('client_closed'));
  // undici reconnects after an aborted response (nodejs/undici#5845); such a connection
  // never carries a request and is closed after UNUSED_CONNECTION_MS.
  await until(() => up.connections === 1, 'only the staying stream left upstream', UNUSED_CONNECTION_MS + 5_000);
  t.equal(up.connections, 1);
  t.ok(stays.text().includes('data: first') && !stays.socket.destroyed, 'the staying stream is untouched');
  stays.socket.destroy();
});

t.test('a caller answering without the call (an error after the head) releases the upstream', async (t) => {
  const up = new Upstream((_req, res) => {
    res.writeHead(302, { location: 'http://elsewhere/', 'content-type': 'text/event-stream' });
    res.write('data: never forwarded\n\n'); // and the stream stays open
  });
  const proxy = await startProxy(await up.start(), async (_call, _head, res) => {
    res.writeHead(502, { 'content-type': 'application/json', 'content-length': 19 }).end('{"error":"refused"}');
    return 'answered';
  });
  t.teardown(() => (proxy.stop(), up.stop()));
  const c = rawGet(proxy.port, '/redirect');
  await until(() => c.text().endsWith('{"error":"refused"}'), 'the error answer');
  t.notMatch(c.text(), /never forwarded/);
  await until(() => up.closed.length === 1, 'the upstream request was closed, not left hanging');
  t.pass('upstream saw the close');
  c.socket.destroy();
});

t.test('discard drops a rejected body and keeps the connection for the next request', async (t) => {
  let n = 0;
  const up = new Upstream((_req, res) => {
    n++;
    if (n === 1) {
      res.writeHead(401, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'x'.repeat(5000) }));
    } else {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': 11 }).end('{"ok":true}');
    }
  });
  const origin = await up.start();
  const agent = createUpstreamAgent();
  const server = createServer((req, res) => {
    void (async () => {
      const first = new UpstreamCall(agent, { target: { origin, path: '/a' }, method: 'POST', headers: {}, body: Buffer.from('{}') }, res);
      const h1 = await first.head;
      t.equal(h1.statusCode, 401, 'first answer is the rejection');
      await first.discard();
      const second = new UpstreamCall(agent, { target: { origin, path: '/b' }, method: 'POST', headers: {}, body: Buffer.from('{}') }, res);
      const h2 = await second.head;
      await second.pipe(h2.statusCode, passed(h2));
      t.equal(second.bytesOut, 11, 'bytes counted');
    })();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => (server.closeAllConnections(), server.close(), void agent.close(), up.stop()));
  const c = rawGet((server.address() as AddressInfo).port, '/');
  await until(() => c.text().endsWith('{"ok":true}'), 'the second answer');
  t.notMatch(c.text(), /xxxx/, 'nothing of the rejected body reached the agent');
  t.equal(c.text().match(/HTTP\/1\.1/g)?.length, 1, 'exactly one response');
  t.equal(up.sockets[0]?.destroyed, false, 'the rejected exchange was read to its end, not cut: its connection stays open for reuse');
  c.socket.destroy();
});

t.test('an upstream failing mid-body cuts the agent connection', async (t) => {
  const up = new Upstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': 100_000 });
    res.write(Buffer.alloc(10_000, 0x61), () => setTimeout(() => res.destroy(), 20));
  });
  const proxy = await startProxy(await up.start());
  t.teardown(() => (proxy.stop(), up.stop()));
  const c = rawGet(proxy.port, '/cut');
  await once(c.socket, 'close');
  t.ok(c.text().includes('aaaa'), 'the part that arrived was forwarded');
  t.ok(Buffer.concat(c.chunks).length < 100_000, 'the agent did not get a complete-looking body');
  await until(() => proxy.outcomes.length === 1, 'outcome');
  t.same(proxy.outcomes, ['upstream_failed']);
});

t.test('a reader that stops holds the upstream back (backpressure, no buffering)', async (t) => {
  const total = 64 * 1024 * 1024;
  let written = 0;
  let stalled = false;
  const up = new Upstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
    const chunk = Buffer.alloc(64 * 1024, 0x62);
    const pump = (): void => {
      while (written < total) {
        written += chunk.length;
        if (!res.write(chunk)) {
          stalled = true;
          res.once('drain', () => ((stalled = false), pump()));
          return;
        }
      }
      res.end();
    };
    pump();
  });
  const proxy = await startProxy(await up.start());
  t.teardown(() => (proxy.stop(), up.stop()));
  const req = request({ port: proxy.port, path: '/big' });
  req.end();
  const [res] = (await once(req, 'response')) as [IncomingMessage];
  res.pause();
  // Wait until the upstream has been stuck for a while with the reader paused.
  let stuckSince = 0;
  await until(() => {
    if (!stalled) stuckSince = 0;
    else if (stuckSince === 0) stuckSince = Date.now();
    return stuckSince !== 0 && Date.now() - stuckSince > 300;
  }, 'the upstream to stall');
  t.ok(written < total / 2, `the upstream stopped after ${(written / 1048576).toFixed(1)} MiB of 64 MiB`);
  let got = 0;
  res.on('data', (c: Buffer) => (got += c.length));
  res.resume();
  await once(res, 'end');
  t.equal(got, total, 'every byte arrived once the reader resumed');
});
