import { createHash } from 'node:crypto';
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, type LogLine } from '../test/support/cli-proc.js';
import { json, sse, type MockGateway, type SeenRequest } from '../test/support/mock-gateway.js';
import { deferred, until, within } from '../test/support/poll.js';
import { forwarderRig, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { closedPort, StreamReader } from './helpers/sse-client.js';

const BINDING = 'bind_streaming_0001';
const TOKEN = 'tok-streaming-S3cr3t-9f1c';
const MiB = 1024 * 1024;

/** A forwarder with one binding to `upstreamUrl` (default: a fresh mock Gateway). */
const setup = (tt: TapTest, opts: { args?: string[]; upstreamUrl?: (gw: MockGateway) => string } = {}) =>
  forwarderRig(tt, { binding: BINDING, token: TOKEN, args: opts.args ?? [], ...(opts.upstreamUrl ? { upstreamUrl: opts.upstreamUrl } : {}) });

const MCP_POST = {
  method: 'POST' as const,
  headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
  body: '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}',
};

/** The access log line of the request the upstream saw (matched by x-request-id). */
function accessLineFor(fwd: ProxyProc, seen: SeenRequest): Promise<LogLine> {
  const reqId = seen.headers['x-request-id'];
  return fwd.waitForLog((l) => l.msg === 'access' && l.reqId === reqId);
}

/** Opens an SSE response at the mock upstream and hands the sender to the test. */
function sseHandle(gw: MockGateway): Promise<{ send: (data: string) => void; end: () => void; res: ServerResponse; seen: SeenRequest }> {
  const ready = deferred<{ send: (data: string) => void; end: () => void; res: ServerResponse; seen: SeenRequest }>();
  gw.handle((seen, res) => {
    const s = sse(res);
    ready.resolve({ ...s, res, seen });
  });
  return ready.promise;
}

t.test('9. SSE: the agent gets status and headers while the upstream has sent no event yet', async (t) => {
  const { gw, url } = await setup(t);
  const upstream = sseHandle(gw);
  const res = await within(request(url, MCP_POST), 10_000, 'response headers with no event sent');
  const up = await upstream;
  t.equal(res.statusCode, 200);
  t.match(res.headers['content-type'], /^text\/event-stream/);
  t.equal(res.headers['cache-control'], 'no-cache', 'whitelisted cache-control passed');
  const reader = new StreamReader(res.body);
  t.equal(reader.received, 0, 'no body byte reached the agent');
  // The stream still works afterwards.
  up.send('event: message\ndata: {"late":true}\n\n');
  await reader.waitForText('"late":true');
  up.end();
  t.same(await reader.ended, { kind: 'end' }, 'clean end after the upstream ended');
});

t.test('10. SSE: each event reaches the agent before the upstream sends the next; byte-identical', async (t) => {
  const { gw, url } = await setup(t);
  const events = [
    'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}\n\n',
    ': keep-alive comment\n\n',
    'id: 2\ndata: line one\ndata: line two ü ✓\n\n',
    `data: ${'x'.repeat(70_000)}\n\n`,
    'event: message\r\ndata: {"crlf":true}\r\n\r\n',
    'data: {"jsonrpc":"2.0","id":1,"result":{"content":[]}}\n\n',
  ];
  const upstream = sseHandle(gw);
  const res = await request(url, MCP_POST);
  t.equal(res.statusCode, 200);
  const up = await upstream;
  const reader = new StreamReader(res.body);
  const order: string[] = [];
  let expected = 0;
  for (const [i, ev] of events.entries()) {
    up.send(ev);
    order.push(`sent ${i}`);
    expected += Buffer.byteLength(ev);
    // The upstream sends the next event only once this one is at the agent: a
    // buffering forwarder never gets here and the deadline fails the test.
    await reader.waitForBytes(expected);
    order.push(`received ${i}`);
    t.equal(reader.received, expected, `after event ${i} the agent has exactly the bytes sent so far`);
  }
  up.end();
  t.same(await reader.ended, { kind: 'end' });
  t.same(
    order,
    events.flatMap((_, i) => [`sent ${i}`, `received ${i}`]),
    'each event arrived before the next was sent',
  );
  t.ok(reader.bytes().equals(Buffer.from(events.join(''))), 'concatenated bytes are byte-identical');
});

t.test('11. agent disconnect mid-stream aborts the upstream request; access log says client_closed', async (t) => {
  const { gw, fwd, url } = await setup(t);
  const upstream = sseHandle(gw);
  const res = await request(url, MCP_POST);
  const up = await upstream;
  const reader = new StreamReader(res.body);
  up.send('data: first\n\n');
  await reader.waitForText('data: first');
  t.notOk(up.seen.wasAborted(), 'upstream request still open while the agent reads');
  res.body.destroy();
  await within(up.seen.aborted, 10_000, 'the upstream to see the close');
  t.ok(up.seen.wasAborted(), 'upstream saw its request go away before the end');
  const line = await accessLineFor(fwd, up.seen);
  t.equal(line.outcome, 'client_closed');
  t.equal(line.method, 'POST');
});

t.test('11. agent disconnect before the upstream answered (long tool call) aborts the upstream request', async (t) => {
  const { gw, fwd, url } = await setup(t);
  gw.handle(() => {
    // A long tool call: no headers yet.
  });
  const controller = new AbortController();
  const pending = request(url, { ...MCP_POST, signal: controller.signal });
  const seen = await within(gw.waitForRequests(1), 10_000, 'the request to reach the upstream');
  t.notOk(seen.wasAborted(), 'upstream request open while the agent waits');
  controller.abort();
  await t.rejects(pending, 'the agent gave up');
  await within(seen.aborted, 10_000, 'the upstream to see the close');
  t.ok(seen.wasAborted(), 'the upstream saw its request go away');
  const line = await accessLineFor(fwd, seen);
  t.equal(line.outcome, 'client_closed');
});

t.test('backpressure: a paused agent stalls the upstream; all bytes arrive after resume', async (t) => {
  const { gw, url } = await setup(t);
  const TOTAL = 64 * MiB;
  const CHUNK = 64 * 1024;
  const chunkOf = (i: number): Buffer => Buffer.alloc(CHUNK, (i * 7 + 1) & 0xff);
  const expectedHash = createHash('sha256');
  for (let i = 0; i * CHUNK < TOTAL; i++) expectedHash.update(chunkOf(i));

  let written = 0;
  let writeReturnedFalse = 0;
  let waitingForDrain = false;
  let lastProgress = Date.now();
  gw.handle(async (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': TOTAL });
    for (let i = 0; written < TOTAL; i++) {
      const ok = res.write(chunkOf(i));
      written += CHUNK;
      lastProgress = Date.now();
      if (!ok) {
        writeReturnedFalse++;
        waitingForDrain = true;
        await once(res, 'drain');
        waitingForDrain = false;
      }
    }
    res.end();
  });

  const res = await request(url, MCP_POST);
  t.equal(res.statusCode, 200);
  // The agent reads nothing. Wait until the upstream is either done (no backpressure) or
  // stuck in a write that returned false and has made no progress since.
  await until(
    () => written >= TOTAL || (waitingForDrain && Date.now() - lastProgress > 750),
    'the upstream to finish or to stall',
    20_000,
  );
  const writtenWhilePaused = written;
  t.ok(writeReturnedFalse > 0, 'the upstream saw res.write() return false');
  t.ok(waitingForDrain, 'the upstream is blocked waiting for drain while the agent is paused');
  t.ok(
    writtenWhilePaused < TOTAL / 2,
    `the upstream wrote ${(writtenWhilePaused / MiB).toFixed(1)} MiB of ${TOTAL / MiB} MiB while the agent was paused (must stay under half)`,
  );

  // Resume: everything arrives, byte-count exact and byte-identical.
  const hash = createHash('sha256');
  let got = 0;
  for await (const chunk of res.body) {
    const buf = chunk as Buffer;
    got += buf.length;
    hash.update(buf);
  }
  t.equal(got, TOTAL, 'all bytes arrived after resume');
  t.equal(hash.digest('hex'), expectedHash.digest('hex'), 'and they are the bytes the upstream sent');
  t.equal(written, TOTAL, 'the upstream finished writing');
});

/** Everything the agent could read of an answer: status line facts, headers, body. */
function visibleText(res: { statusCode: number; headers: Record<string, string | string[] | undefined> }, body: string): string {
  return `${res.statusCode}\n${JSON.stringify(res.headers)}\n${body}`;
}

function assertNoUpstreamDetail(t: TapTest, text: string, port: number, extra: readonly string[] = []): void {
  for (const needle of [String(port), 'ECONNREFUSED', '127.0.0.1', 'ERR_', 'secret-gw-path', ...extra]) {
    t.notOk(text.toLowerCase().includes(needle.toLowerCase()), `the answer does not contain ${JSON.stringify(needle)}`);
  }
}

t.test('12. upstream unreachable → 502 upstream_unreachable with no upstream detail', async (t) => {
  t.test('connection refused', async (t) => {
    const port = await closedPort();
    const { gw, url } = await setup(t, { upstreamUrl: () => `http://127.0.0.1:${port}/secret-gw-path/mcp` });
    const res = await request(url, MCP_POST);
    const body = await res.body.text();
    t.equal(res.statusCode, 502);
    t.match(res.headers['content-type'], /^application\/json/);
    t.same(Object.keys(JSON.parse(body) as object).sort(), ['error', 'message']);
    t.equal((JSON.parse(body) as { error: string }).error, 'upstream_unreachable');
    assertNoUpstreamDetail(t, visibleText(res, body), port);
    t.equal(gw.requests.length, 0);
  });

  t.test('TLS failure (https to a plain-HTTP server)', async (t) => {
    let port = 0;
    const { gw, url } = await setup(t, {
      upstreamUrl: (g) => {
        port = g.port;
        return `https://127.0.0.1:${g.port}/secret-gw-path/mcp`;
      },
    });
    const res = await request(url, MCP_POST);
    const body = await res.body.text();
    t.equal(res.statusCode, 502);
    t.equal((JSON.parse(body) as { error: string }).error, 'upstream_unreachable');
    assertNoUpstreamDetail(t, visibleText(res, body), port, ['ssl', 'tls', 'wrong version', 'certificate', 'EPROTO', 'openssl', 'handshake', 'socket']);
    t.equal(gw.requests.length, 0, 'no HTTP request reached the plain server');
  });
});

t.test('headers timeout', async (t) => {
  t.test('no upstream headers within --headers-timeout-ms → 504 upstream_timeout; upstream sees the abort', async (t) => {
    const { gw, fwd, url } = await setup(t, { args: ['--headers-timeout-ms', '500'] });
    gw.handle(() => {
      // Never answers.
    });
    const res = await within(request(url, MCP_POST), 15_000, 'the forwarder to give up on the upstream');
    const body = await res.body.text();
    t.equal(res.statusCode, 504);
    t.equal((JSON.parse(body) as { error: string }).error, 'upstream_timeout');
    const seen = gw.requests[0];
    t.ok(seen, 'the upstream was called');
    if (!seen) return;
    await within(seen.aborted, 10_000, 'the upstream to see the abort');
    t.ok(seen.wasAborted(), 'the upstream saw the request go away');
    const line = await accessLineFor(fwd, seen);
    t.equal(line.status, 504);
  });

  t.test('an SSE stream silent for longer than the headers timeout is not cut', async (t) => {
    const { gw, url } = await setup(t, { args: ['--headers-timeout-ms', '500'] });
    const upstream = sseHandle(gw);
    const res = await request(url, MCP_POST);
    t.equal(res.statusCode, 200);
    const up = await upstream;
    const reader = new StreamReader(res.body);
    // Silence four times the headers timeout (this wait is the scenario, not an assertion).
    await new Promise((r) => setTimeout(r, 2_000));
    t.equal(reader.finished, undefined, 'the agent stream is still open after the silence');
    t.notOk(up.seen.wasAborted(), 'the upstream request is still open after the silence');
    up.send('data: {"after":"silence"}\n\n');
    await reader.waitForText('{"after":"silence"}');
    up.end();
    t.same(await reader.ended, { kind: 'end' });
    t.equal(reader.text(), 'data: {"after":"silence"}\n\n');
  });
});

t.test('failure after headers: the upstream dies mid-stream → the agent connection is destroyed', async (t) => {
  const { gw, fwd, url } = await setup(t);
  const upstream = sseHandle(gw);
  const res = await request(url, MCP_POST);
  t.equal(res.statusCode, 200);
  const up = await upstream;
  const reader = new StreamReader(res.body);
  up.send('data: one\n\n');
  await reader.waitForText('data: one');
  up.res.socket?.destroy();
  const end = await within(reader.ended, 10_000, 'the agent stream to finish');
  t.equal(end.kind, 'error', 'the agent sees an error / premature close, not a clean end');
  t.equal(reader.text(), 'data: one\n\n', 'what arrived before the failure is intact');
  const line = await accessLineFor(fwd, up.seen);
  t.not(line.outcome, 'ok', 'the access log does not call it ok');
});

t.test('upstream non-2xx passes through unchanged (except 401)', async (t) => {
  const { gw, url } = await setup(t);
  const cases: Array<{ status: number; type: string; body: string; extra?: Record<string, string> }> = [
    { status: 400, type: 'application/json', body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Bad Request: ü"}}' },
    { status: 404, type: 'application/json', body: '{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Session not found"}}' },
    { status: 500, type: 'text/plain; charset=utf-8', body: 'upstream exploded\n\tat somewhere' },
    { status: 403, type: 'application/json', body: '{"error":"forbidden"}' },
    { status: 429, type: 'application/json', body: '{"error":"slow down"}', extra: { 'retry-after': '7' } },
  ];
  for (const c of cases) {
    gw.handle((_req, res) => {
      res.writeHead(c.status, { 'content-type': c.type, 'content-length': Buffer.byteLength(c.body), ...c.extra });
      res.end(c.body);
    });
    const res = await request(url, MCP_POST);
    const got = Buffer.from(await res.body.arrayBuffer());
    t.equal(res.statusCode, c.status, `status ${c.status} passed`);
    t.equal(res.headers['content-type'], c.type, `content-type of ${c.status} passed`);
    t.ok(got.equals(Buffer.from(c.body)), `body of ${c.status} byte-identical`);
    if (c.extra) t.equal(res.headers['retry-after'], c.extra['retry-after'], 'retry-after passed');
  }
  t.equal(gw.requests.length, cases.length, 'one upstream call per request (no retries)');
});

t.test('GET (server-to-client SSE) and DELETE are forwarded with their method', async (t) => {
  const { gw, url } = await setup(t);
  const SESSION = 'sess-3f2a9c1e-get-delete';
  const upstream = sseHandle(gw);
  const res = await request(url, {
    method: 'GET',
    headers: { accept: 'text/event-stream', 'mcp-session-id': SESSION, 'last-event-id': 'ev-41', 'mcp-protocol-version': '2025-06-18' },
  });
  t.equal(res.statusCode, 200);
  t.match(res.headers['content-type'], /^text\/event-stream/);
  const up = await upstream;
  t.equal(up.seen.method, 'GET');
  t.equal(up.seen.body.length, 0, 'GET carries no body upstream');
  t.equal(up.seen.headers['mcp-session-id'], SESSION);
  t.equal(up.seen.headers['last-event-id'], 'ev-41');
  t.equal(up.seen.headers.authorization, `Bearer ${TOKEN}`);
  const reader = new StreamReader(res.body);
  up.send('id: ev-42\ndata: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n\n');
  await reader.waitForText('ev-42');
  up.end();
  t.same(await reader.ended, { kind: 'end' });

  gw.handle((_req, res) => json(res, 200, {}));
  const del = await request(url, { method: 'DELETE', headers: { 'mcp-session-id': SESSION } });
  await del.body.dump();
  t.equal(del.statusCode, 200);
  const seenDel = gw.requests.at(-1);
  t.equal(seenDel?.method, 'DELETE');
  t.equal(seenDel?.headers['mcp-session-id'], SESSION, 'DELETE carries the session id upstream');
  t.equal(seenDel?.headers.authorization, `Bearer ${TOKEN}`);
});

checkNoLeaks(t);
