import { mkdirSync, rmSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import t from 'tap';
import { MAX_TOKEN_RETRIES } from '../src/token/token-wait.js';
import { request } from 'undici';
import { checkNoLeaks, knownSecrets, leakedSecrets, waitForLogAfter, writeToken } from '../test/support/cli-proc.js';
import { json } from '../test/support/mock-gateway.js';
import { forwarderRig } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { assertJsonError, RawConnection, send, type Resp } from './helpers/http-raw.js';

const BINDING = 'bind_headers_token_01';

/** A forwarder with one binding; the token file is written only when `token` is given. */
const setup = (tt: TapTest, token?: string) => forwarderRig(tt, token === undefined ? { binding: BINDING } : { binding: BINDING, token });

const RPC = '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search","arguments":{"q":"x"}}}';

t.test('2. only whitelisted headers pass, both ways; the agent\'s own credentials never reach the upstream', async (t) => {
  const { gw, url } = await setup(t, 'tok-headers-BBBB');
  const gz = gzipSync(Buffer.from('{"jsonrpc":"2.0","id":3,"result":{"content":[]}}'));
  const passedResponse: Record<string, string> = {
    'content-type': 'application/json',
    'mcp-session-id': 'sess-from-gateway-1',
    'mcp-protocol-version': '2025-06-18',
    'cache-control': 'no-cache, no-transform',
    'retry-after': '7',
    'content-encoding': 'gzip',
  };
  gw.handle((_req, res) => {
    res.writeHead(200, {
      ...passedResponse,
      'content-length': gz.length,
      'set-cookie': ['gw_session=abc123; HttpOnly; Secure', 'lb=node-7'],
      'www-authenticate': 'Bearer resource_metadata="https://gw.example/.well-known/oauth-protected-resource"',
      server: 'gateway/1.0',
      'x-powered-by': 'Express',
      'x-gateway-internal': 'node-7',
    });
    res.end(gz);
  });

  const whitelisted: Record<string, string> = {
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
    'mcp-session-id': 'sess-from-gateway-1',
    'mcp-protocol-version': '2025-06-18',
    'last-event-id': 'evt-42',
    'mcp-method': 'tools/call',
    'mcp-name': 'search',
    'mcp-param-foo': 'bar baz',
    'user-agent': 'claude-code/1.2.3 (test)',
  };
  const dropped: Record<string, string> = {
    authorization: 'Bearer agent-own-credential-ZZZZ',
    cookie: 'sid=agent-cookie-value',
    origin: 'http://127.0.0.1:5173',
    referer: 'http://127.0.0.1:5173/page',
    forwarded: 'for=10.0.0.1;proto=https',
    'x-forwarded-for': '10.0.0.1',
    'x-forwarded-host': 'evil.example',
    'x-forwarded-proto': 'https',
    'proxy-authorization': 'Basic cHJveHk6cHc=',
    'x-custom': 'custom-value',
  };

  const res = await request(url, { method: 'POST', headers: { ...whitelisted, ...dropped }, body: RPC });
  const got = Buffer.from(await res.body.arrayBuffer());
  t.equal(res.statusCode, 200);
  t.ok(got.equals(gz), 'encoded body passed byte-identical (no decoding on the way)');

  const seen = gw.requests[0];
  t.equal(gw.requests.length, 1, 'upstream called once');
  if (!seen) return;
  for (const [name, value] of Object.entries(whitelisted)) t.equal(seen.headers[name], value, `upstream got ${name} unchanged`);
  for (const name of Object.keys(dropped)) {
    if (name === 'authorization') continue;
    t.equal(seen.headers[name], undefined, `upstream did not get the agent's ${name}`);
  }
  t.equal(seen.headers.authorization, 'Bearer tok-headers-BBBB', "authorization is the file token, not the agent's");
  t.notOk(seen.rawHeaders.join('\n').includes('agent-own-credential-ZZZZ'), "the agent's own credential appears nowhere upstream");
  t.equal(seen.headers.host, `127.0.0.1:${gw.port}`, "host is the upstream's host:port");
  t.match(seen.headers['x-request-id'], /^\S{8,}$/, 'x-request-id set by the forwarder');
  const allowedUp = new Set([
    ...Object.keys(whitelisted),
    'authorization',
    'host',
    'x-request-id',
    'content-length',
    'transfer-encoding',
    'connection',
  ]);
  const upNames = Object.keys(seen.headers).filter((n) => !allowedUp.has(n));
  t.same(upNames, [], 'the upstream received no header outside the whitelist');
  t.equal(seen.body.toString(), RPC, 'body unchanged');

  for (const [name, value] of Object.entries(passedResponse)) t.equal(res.headers[name], value, `agent got ${name} unchanged`);
  t.equal(res.headers['content-length'], String(gz.length), 'content-length passed');
  for (const name of ['set-cookie', 'www-authenticate', 'server', 'x-powered-by', 'x-gateway-internal']) {
    t.equal(res.headers[name], undefined, `agent did not get ${name}`);
  }
  const allowedDown = new Set([...Object.keys(passedResponse), 'content-length', 'date', 'connection', 'keep-alive', 'transfer-encoding']);
  const downNames = Object.keys(res.headers).filter((n) => !allowedDown.has(n));
  t.same(downNames, [], 'the agent received no upstream header outside the whitelist');
});

t.test('2b. hop-by-hop headers from the agent are not forwarded', async (t) => {
  const { gw, fwd } = await setup(t, 'tok-hop-by-hop-BBBB');
  const conn = await RawConnection.open(fwd.port);
  t.teardown(() => conn.destroy());
  await conn.write(
    `POST /i/${BINDING}/mcp HTTP/1.1\r\n` +
      `Host: 127.0.0.1:${fwd.port}\r\n` +
      'Content-Type: application/json\r\n' +
      `Content-Length: ${Buffer.byteLength(RPC)}\r\n` +
      'Connection: keep-alive, X-Hop-Secret\r\n' +
      'X-Hop-Secret: hop-value\r\n' +
      'Keep-Alive: timeout=99\r\n' +
      'TE: trailers\r\n' +
      'Proxy-Connection: keep-alive\r\n' +
      'Trailer: X-Late\r\n' +
      '\r\n' +
      RPC,
  );
  const resp = await conn.readResponse();
  t.equal(resp.status, 200);
  const seen = gw.requests[0];
  t.ok(seen, 'upstream called');
  for (const name of ['x-hop-secret', 'keep-alive', 'te', 'proxy-connection', 'trailer']) {
    t.equal(seen?.headers[name], undefined, `upstream did not get ${name}`);
  }
  t.notMatch(String(seen?.headers.connection ?? ''), /x-hop-secret/i, "the agent's Connection list is not forwarded");
  t.equal(seen?.body.toString(), RPC);
});

t.test('4. token file missing: 503 token_unavailable, fail closed', async (t) => {
  const { gw, url } = await setup(t);
  for (const method of ['POST', 'GET', 'DELETE']) {
    const resp = await send(url, {
      method,
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    });
    assertJsonError(t, resp, 503, 'token_unavailable', method);
  }
  t.equal(gw.requests.length, 0, 'upstream never called');
});

t.test('4. upstream 401 with an unchanged token: 503 token_rejected, Retry-After, no retry, a warning', async (t) => {
  const { gw, url, fwd } = await setup(t, 'tok-rejected-CCCC');
  gw.handle((_req, res) =>
    json(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token", resource_metadata="https://gw.example/.well-known/oauth-protected-resource"' }),
  );
  const mark = fwd.logs.length;
  const resp = await send(url, { body: RPC });
  assertJsonError(t, resp, 503, 'token_rejected');
  t.not(resp.status, 401, 'never a 401');
  t.match(String(resp.headers['retry-after'] ?? ''), /^\d+$/, 'Retry-After in seconds');
  t.equal(resp.headers['www-authenticate'], undefined, 'no www-authenticate');
  t.equal(gw.requests.length, 1, 'exactly one upstream request: the token did not change, so no retry');
  const warn = await waitForLogAfter(fwd, mark, (l) => l.level === 'warn');
  t.ok(warn, 'a warning was logged');
  t.same(leakedSecrets(JSON.stringify(warn)), [], 'the warning carries no token');
});

t.test('4. upstream 401 while renewal replaced the token: one retry with the new token succeeds', async (t) => {
  const { gw, url, tokenFile } = await setup(t, 'tok-retry-old-DDDD');
  const ok = '{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"done"}]}}';
  gw.handle((req, res) => {
    if (req.headers.authorization === 'Bearer tok-retry-old-DDDD') {
      // Renewal lands while this request is in flight, then the Gateway rejects the old token.
      writeToken(tokenFile, 'tok-retry-new-EEEE');
      json(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token"' });
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(ok) });
    res.end(ok);
  });
  const resp = await send(url, { body: RPC, headers: { 'content-type': 'application/json', 'mcp-session-id': 'sess-9' } });
  t.equal(resp.status, 200, "the agent gets the retry's answer");
  t.equal(resp.body, ok, "the retry's body");
  t.equal(resp.headers['www-authenticate'], undefined);
  t.equal(gw.requests.length, 2, 'exactly two upstream requests');
  t.equal(gw.requests[0]?.headers.authorization, 'Bearer tok-retry-old-DDDD', 'first with the old token');
  t.equal(gw.requests[1]?.headers.authorization, 'Bearer tok-retry-new-EEEE', 'retry with the new token');
  t.equal(gw.requests[0]?.body.toString(), RPC, 'first body complete');
  t.equal(gw.requests[1]?.body.toString(), RPC, 'retry body identical');
  t.equal(gw.requests[1]?.headers['mcp-session-id'], 'sess-9', 'retry keeps the whitelisted headers');
});

t.test('4. a file that keeps changing to refused tokens: at most MAX_TOKEN_RETRIES retries, then 503 token_rejected', async (t) => {
  const { gw, url, tokenFile } = await setup(t, 'tok-twice-one-FFFF');
  let n = 0;
  gw.handle((_req, res) => {
    n += 1;
    // Every answer comes after renewal wrote yet another token, each refused too: a retry
    // per new token (a renewal superseded in flight), but never without end.
    writeToken(tokenFile, `tok-twice-next-${n}-FFFF`);
    json(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token"' });
  });
  const resp = await send(url, { body: RPC });
  assertJsonError(t, resp, 503, 'token_rejected');
  t.ok(resp.headers['retry-after'], 'Retry-After');
  t.equal(resp.headers['www-authenticate'], undefined);
  t.equal(gw.requests.length, 1 + MAX_TOKEN_RETRIES, `the original request and ${MAX_TOKEN_RETRIES} retries, no more`);
  t.same(
    new Set(gw.requests.map((q) => q.headers.authorization)).size,
    gw.requests.length,
    'each retry carried a token the file newly held',
  );
});

t.test('5. empty or malformed token files: 503 token_unavailable, upstream never called', async (t) => {
  const { gw, url, tokenFile } = await setup(t);
  knownSecrets.add('tok-inner-line-one-GGGG');
  knownSecrets.add('tok-inner-line-two-GGGG');
  const cases: Array<[string, () => void]> = [
    ['empty file', () => writeToken(tokenFile, '', true)],
    ['only a newline', () => writeToken(tokenFile, '\n', true)],
    ['only CRLF', () => writeToken(tokenFile, '\r\n', true)],
    ['a space inside', () => writeToken(tokenFile, 'tok-with space-GGGG')],
    ['a leading space', () => writeToken(tokenFile, ' tok-leading-space-GGGG', true)],
    ['a tab inside', () => writeToken(tokenFile, 'tok-with\ttab-GGGG')],
    ['a CR inside', () => writeToken(tokenFile, 'tok-with\rcr-GGGG')],
    ['an inner newline', () => writeToken(tokenFile, 'tok-inner-line-one-GGGG\ntok-inner-line-two-GGGG\n', true)],
    ['two trailing newlines', () => writeToken(tokenFile, 'tok-two-newlines-GGGG\n\n', true)],
    ['non-ASCII', () => writeToken(tokenFile, 'tok-nön-ascii-GGGG')],
    ['17 KiB', () => writeToken(tokenFile, `tok-huge-${'T'.repeat(17 * 1024)}`)],
    ['16 KiB + 1 byte', () => writeToken(tokenFile, `tok-big-${'U'.repeat(16 * 1024 + 1 - 8)}`)],
    [
      'a directory',
      () => {
        rmSync(tokenFile, { force: true });
        mkdirSync(tokenFile);
      },
    ],
  ];
  for (const [what, write] of cases) {
    write();
    const resp = await send(url, { body: RPC });
    assertJsonError(t, resp, 503, 'token_unavailable', what);
    t.same(leakedSecrets(resp.text), [], `${what}: no token in the answer`);
    t.equal(gw.requests.length, 0, `${what}: upstream never called`);
  }
  rmSync(tokenFile, { recursive: true, force: true });

  writeToken(tokenFile, 'tok-crlf-HHHH\r\n', true);
  const resp = await send(url, { body: RPC });
  t.equal(resp.status, 200, 'a token ending in CRLF works');
  t.equal(gw.requests.length, 1);
  t.equal(gw.requests[0]?.headers.authorization, 'Bearer tok-crlf-HHHH', 'sent without the CRLF');
});

t.test('6. every token path at trace level: no token in any response or log line', async (t) => {
  const { gw, url, tokenFile, fwd } = await setup(t, 'tok-leak-ok-JJJJ');
  const responses: Array<[string, Resp]> = [];
  const call = async (what: string): Promise<Resp> => {
    const resp = await send(url, { body: RPC, headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' } });
    responses.push([what, resp]);
    return resp;
  };

  // ok
  t.equal((await call('ok')).status, 200);
  // hot swap
  writeToken(tokenFile, 'tok-leak-swapped-KKKK');
  t.equal((await call('hot swap')).status, 200);
  t.equal(gw.requests.at(-1)?.headers.authorization, 'Bearer tok-leak-swapped-KKKK');
  // 401, token unchanged
  gw.handle((_req, res) => json(res, 401, { error: 'invalid_token' }, { 'www-authenticate': 'Bearer error="invalid_token"' }));
  t.equal((await call('401')).status, 503);
  // 401, token renewed in flight: retry
  gw.handle((req, res) => {
    if (req.headers.authorization === 'Bearer tok-leak-swapped-KKKK') {
      writeToken(tokenFile, 'tok-leak-renewed-LLLL');
      json(res, 401, { error: 'invalid_token' });
      return;
    }
    json(res, 200, { jsonrpc: '2.0', id: 3, result: {} });
  });
  t.equal((await call('retry')).status, 200);
  t.equal(gw.requests.at(-1)?.headers.authorization, 'Bearer tok-leak-renewed-LLLL');
  // malformed
  writeToken(tokenFile, 'tok-leak-bad token-MMMM');
  t.equal((await call('malformed')).status, 503);
  // missing
  rmSync(tokenFile);
  t.equal((await call('missing')).status, 503);

  for (const [what, resp] of responses) {
    t.same(leakedSecrets(resp.text), [], `${what}: no token in status, headers or body`);
  }
  const upstreamSaw = gw.requests.map((r) => r.headers.authorization);
  t.same(upstreamSaw, [
    'Bearer tok-leak-ok-JJJJ',
    'Bearer tok-leak-swapped-KKKK',
    'Bearer tok-leak-swapped-KKKK',
    'Bearer tok-leak-swapped-KKKK',
    'Bearer tok-leak-renewed-LLLL',
  ], 'the upstream saw each token (so the tokens were really in play)');

  await fwd.stop('SIGTERM');
  t.ok(fwd.logs.some((l) => l.level === 'trace' || l.level === 'debug' || l.msg === 'access'), 'the run logged');
  t.ok(fwd.logs.some((l) => l.level === 'warn'), 'the 401 path logged its warning');
  t.same(leakedSecrets(fwd.lines.join('\n')), [], 'no token in any log line of this forwarder');
});

t.test('7. unknown or malformed bindingId: 404, upstream never called', async (t) => {
  const { gw, fwd } = await setup(t, 'tok-unknown-NNNN');
  for (const method of ['POST', 'GET', 'DELETE']) {
    const resp = await send(`${fwd.base}/i/bind_not_registered_01/mcp`, { method });
    assertJsonError(t, resp, 404, 'unknown_binding', `${method} well-formed unknown id`);
  }
  const cased = await send(`${fwd.base}/i/${BINDING.toUpperCase()}/mcp`);
  assertJsonError(t, cased, 404, 'unknown_binding', 'ids are case-sensitive');
  for (const bad of ['short', 'bad$chars!!', 'bad.chars.here', 'bad%20chars_xx', 'x'.repeat(129)]) {
    const resp = await send(`${fwd.base}/i/${bad}/mcp`);
    assertJsonError(t, resp, 404, ['unknown_binding', 'not_found'], `malformed id ${bad.slice(0, 16)}`);
  }
  t.equal(gw.requests.length, 0, 'upstream never called');
});

checkNoLeaks(t);
