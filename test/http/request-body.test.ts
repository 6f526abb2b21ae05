import { once } from 'node:events';
import { createServer, request as httpRequest, Agent, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { AppError } from '../../src/errors.js';
import { ClientGoneError } from '../../src/errors.js';
import { readBody } from '../../src/http/request-body.js';
import { deferred, within } from '../support/poll.js';
import type { TapTest } from '../support/tap.js';

const LIMIT = 1024;

type Outcome = { ok: true; body: Buffer } | { ok: false; error: unknown };

/** A real server that reads each body with `readBody(LIMIT)`, answers 200 or 413, and reports each outcome. */
async function serve(t: TapTest): Promise<{ port: number; arrived: () => Promise<{ outcome: Promise<Outcome> }>; next: () => Promise<Outcome> }> {
  const outcomes: Array<Promise<Outcome>> = [];
  let waiter = deferred();
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const outcome = readBody(req, LIMIT).then(
      (body): Outcome => ({ ok: true, body }),
      (error: unknown): Outcome => ({ ok: false, error }),
    );
    outcomes.push(outcome);
    waiter.resolve();
    void outcome.then((o) => {
      if (res.destroyed) return;
      res.writeHead(o.ok ? 200 : 413, { 'content-type': 'text/plain' });
      res.end(o.ok ? `got ${o.body.length}` : 'too large');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  let taken = 0;
  /** The next request's outcome, once the handler has it (wrapped: not yet settled). */
  const arrived = async (): Promise<{ outcome: Promise<Outcome> }> => {
    while (outcomes.length <= taken) {
      await waiter.promise;
      waiter = deferred();
    }
    return { outcome: outcomes[taken++] as Promise<Outcome> };
  };
  const next = async (): Promise<Outcome> => (await arrived()).outcome;
  return { port: (server.address() as AddressInfo).port, arrived, next };
}

/** Sends `chunks` (chunked unless `length` is given) and reads the answer. */
function send(port: number, chunks: Buffer[], opts: { length?: number; agent?: Agent } = {}): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string | number> = opts.length === undefined ? { 'transfer-encoding': 'chunked' } : { 'content-length': opts.length };
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/', headers, agent: opts.agent ?? false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on('error', reject);
    for (const c of chunks) req.write(c);
    req.end();
  });
}

function isTooLarge(o: Outcome): boolean {
  return !o.ok && o.error instanceof AppError && o.error.code === 'payload_too_large';
}

t.test('a body up to the limit is returned byte for byte, declared or chunked', async (t) => {
  const { port, next } = await serve(t);
  const body = Buffer.alloc(LIMIT, 0xe2);
  t.same(await send(port, [body], { length: LIMIT }), { status: 200, text: `got ${LIMIT}` });
  const declared = await next();
  t.ok(declared.ok && declared.body.equals(body), 'exactly the limit, declared');
  t.same(await send(port, [body.subarray(0, 300), body.subarray(300)]), { status: 200, text: `got ${LIMIT}` });
  const chunked = await next();
  t.ok(chunked.ok && chunked.body.equals(body), 'exactly the limit, in chunks');
  t.same(await send(port, [], { length: 0 }), { status: 200, text: 'got 0' });
  const empty = await next();
  t.ok(empty.ok && empty.body.length === 0, 'an empty body');
});

t.test('a declared length over the limit is refused before any byte is read', async (t) => {
  const { port, next } = await serve(t);
  const answer = send(port, [Buffer.alloc(LIMIT + 1)], { length: LIMIT + 1 });
  t.ok(isTooLarge(await next()), 'payload_too_large');
  t.same(await answer, { status: 413, text: 'too large' }, 'the client, still uploading, reads the 413');
});

t.test('a chunked body that grows past the limit is refused, and the connection stays usable', async (t) => {
  const { port, next } = await serve(t);
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  t.teardown(() => agent.destroy());
  const sockets = new Set<unknown>();
  agent.on('free', (s) => sockets.add(s));
  const big = send(port, [Buffer.alloc(600), Buffer.alloc(600), Buffer.alloc(600)], { agent });
  t.ok(isTooLarge(await next()), 'payload_too_large');
  t.same(await big, { status: 413, text: 'too large' });
  t.same(await send(port, [Buffer.from('{}')], { length: 2, agent }), { status: 200, text: 'got 2' }, 'the next request on the same agent is served');
  t.equal(sockets.size, 1, 'both went over one kept-alive connection (the refused body was drained)');
});

t.test('a client that goes away mid-body: ClientGoneError, nobody to answer', async (t) => {
  const { port, arrived } = await serve(t);
  const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/', headers: { 'content-length': 100 }, agent: false });
  req.on('error', () => undefined);
  req.write(Buffer.alloc(10));
  const { outcome } = await within(arrived(), 10_000, 'the server to see the request');
  req.destroy();
  const o = await within(outcome, 10_000, 'readBody to settle');
  t.ok(!o.ok && o.error instanceof ClientGoneError, 'rejects with ClientGoneError');
});
