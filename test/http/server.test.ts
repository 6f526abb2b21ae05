import { once } from 'node:events';
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:net';
import t from 'tap';
import { closeGracefully, createLoopbackServer, InFlight } from '../../src/http/server.js';
import { deferred, until, within } from '../support/poll.js';
import type { TapTest } from '../support/tap.js';

interface Held {
  res: ServerResponse;
  url: string;
}

/**
 * A loopback server whose handler registers each response in an InFlight, writes its
 * head and a first chunk, then hands it to the test (which ends, or never ends, it).
 */
async function serve(t: TapTest): Promise<{ port: number; inflight: InFlight; held: AsyncIterator<Held>; server: ReturnType<typeof createLoopbackServer> }> {
  const inflight = new InFlight();
  const queue: Held[] = [];
  let wake: (() => void) | undefined;
  const server = createLoopbackServer((req: IncomingMessage, res: ServerResponse) => {
    inflight.add(res);
    if (req.url === '/stream') inflight.markStream(res);
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('first;');
    queue.push({ res, url: req.url ?? '' });
    wake?.();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const held: AsyncIterator<Held> = {
    async next() {
      while (queue.length === 0) await new Promise<void>((r) => (wake = r));
      return { value: queue.shift() as Held, done: false };
    },
  };
  return { port: (server.address() as AddressInfo).port, inflight, held, server };
}

/** A GET whose body is read to the end (or to an error), as text. */
function get(port: number, path: string): Promise<{ status: number; body: string; error?: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', (err) => resolve({ status: res.statusCode ?? 0, body, error: err.message }));
    });
    req.on('error', reject);
    req.end();
  });
}

t.test('InFlight.drain with nothing in flight: clean at once', async (t) => {
  t.equal(await new InFlight().drain(60_000), true);
});

t.test('closeGracefully lets an in-flight response finish, then reports clean', async (t) => {
  const { port, inflight, held, server } = await serve(t);
  const answer = get(port, '/slow');
  const { value: h } = await held.next();
  t.equal(inflight.size, 1);
  const closing = closeGracefully(server, inflight, 60_000);
  t.equal(server.listening, false, 'no longer accepting');
  h.res.end('last');
  t.same(await within(closing, 10_000, 'the close'), { clean: true, streamsCut: 0 });
  t.same(await answer, { status: 200, body: 'first;last' }, 'the client got the whole response');
  t.equal(inflight.size, 0);
});

t.test('closeGracefully cuts what has not finished within the grace', async (t) => {
  const { port, inflight, held, server } = await serve(t);
  const answer = get(port, '/never');
  await held.next();
  t.same(await within(closeGracefully(server, inflight, 50), 10_000, 'the close'), { clean: false, streamsCut: 0 });
  const got = await answer;
  t.ok(got.error !== undefined, 'the client saw the response cut, not a clean end');
  t.equal(got.body, 'first;');
  // The cut response's 'close' may come a tick after the client noticed.
  await until(() => inflight.size === 0, 'the cut response to leave the in-flight set');
});

t.test('closeGracefully cuts marked streams at once and still waits for the others', async (t) => {
  const { port, inflight, held, server } = await serve(t);
  const stream = get(port, '/stream');
  const slow = get(port, '/slow');
  const a = (await held.next()).value;
  const b = (await held.next()).value;
  const other = a.url === '/slow' ? a : b;
  const cut = deferred();
  void stream.then(() => cut.resolve());
  const closing = closeGracefully(server, inflight, 60_000);
  await within(cut.promise, 10_000, 'the stream to be cut');
  t.ok((await stream).error !== undefined, 'the stream was cut');
  t.equal(inflight.size, 1, 'the other response is still in flight');
  other.res.end('done');
  t.same(await within(closing, 10_000, 'the close'), { clean: true, streamsCut: 1 });
  t.same(await slow, { status: 200, body: 'first;done' });
});

t.test('CONNECT is answered 405 method_not_allowed, never tunnelled', async (t) => {
  const { port } = await serve(t);
  const socket = connect(port, '127.0.0.1');
  t.teardown(() => socket.destroy());
  socket.write('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n');
  let text = '';
  socket.setEncoding('utf8');
  socket.on('data', (c: string) => (text += c));
  await once(socket, 'end');
  t.match(text, /^HTTP\/1\.1 405 /);
  t.match(text, /"method_not_allowed"/);
});
