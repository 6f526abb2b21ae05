import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, readFileSync } from 'node:fs';
import type { ServerResponse } from 'node:http';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import t from 'tap';
import { request } from 'undici';
import {
  checkNoLeaks,
  knownSecrets,
  leakedSecrets,
  REPO_ROOT,
  waitForLogAfter,
  writeJsonAtomic,
  writeToken,
  type LogLine,
} from '../test/support/cli-proc.js';
import { json, MockGateway, sse, type SeenRequest } from '../test/support/mock-gateway.js';
import { deferred, within } from '../test/support/poll.js';
import { partDir, startProxy, startRig, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { assertJsonError, RawConnection, rawExchange, send, type Resp } from './helpers/http-raw.js';
import { StreamReader } from './helpers/sse-client.js';

const KiB = 1024;
const MiB = 1024 * KiB;
const VERSION = (JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as { version: string }).version;

type Inject =
  | { type: 'header'; name: string; value: string }
  | { type: 'query'; name: string }
  | { type: 'basic'; username: string; password: string };

interface ProviderSpec {
  upstream: string;
  tokenFile: string;
  inject: Inject;
  commands?: Array<{ name: string; env?: Record<string, string> }>;
}

type Catalog = Record<string, ProviderSpec>;

interface Setup {
  gw: MockGateway;
  proxy: ProxyProc;
  /** `<state>/cli-proxy`, where the token files live. */
  dir: string;
}

const API_KEY: Inject = { type: 'header', name: 'X-Api-Key', value: 'Key {token}' };

/**
 * A mock upstream plus a cli-proxy whose catalog `build` makes (given the upstream and the
 * token directory); waits until that catalog is in force.
 */
async function setup(tt: TapTest, build: (gw: MockGateway, dir: string) => Catalog, args: string[] = []): Promise<Setup> {
  const { upstream, proc } = await startRig(tt, 'cli-proxy', { config: build, args });
  return { gw: upstream, proxy: proc, dir: proc.dir };
}

/** Remembers a token in both spellings a URL, a header or a log could carry it: raw and percent-encoded. */
function rememberSecret(token: string): void {
  knownSecrets.add(token);
  knownSecrets.add(encodeURIComponent(token));
}

function countHeader(seen: SeenRequest, name: string): number {
  let n = 0;
  for (let i = 0; i < seen.rawHeaders.length; i += 2) if (seen.rawHeaders[i]?.toLowerCase() === name) n++;
  return n;
}

function noTokenIn(t: TapTest, resp: Resp | { text: string }, what: string): void {
  t.same(leakedSecrets(resp.text), [], `${what}: no token anywhere in the answer`);
}

/** A raw exchange that reports a dropped connection as a value instead of throwing. */
async function tryRaw(port: number, text: string): Promise<Resp | Error> {
  try {
    return await rawExchange(port, text, 5_000);
  } catch (err) {
    return err as Error;
  }
}

function accessLine(proxy: ProxyProc, mark: number, pred: (l: LogLine) => boolean = () => true): Promise<LogLine> {
  return waitForLogAfter(proxy, mark, (l) => l.msg === 'access' && pred(l));
}

/** The resident set size of a Linux process, in bytes (from /proc/<pid>/status). */
function rssBytes(pid: number): number {
  const m = /^VmRSS:\s+(\d+)\s+kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m?.[1]) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

t.test('header injection under a custom name: the real token replaces every agent credential', async (t) => {
  const TOKEN = 'tok-cliproxy-hdr-A1b2C3';
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    notion: { upstream: gw.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'notion.token'), TOKEN);
  gw.handle((_req, res) => json(res, 200, { object: 'list', results: [] }));

  const passed: Record<string, string> = {
    'notion-version': '2022-06-28',
    accept: 'application/json',
    'content-type': 'application/json; charset=utf-8',
    'user-agent': 'ntn/0.4.2 (linux)',
    'x-custom-trace': 'abc 123',
  };
  const agentCredentials: Record<string, string> = {
    authorization: 'Bearer agent-placeholder-credential',
    cookie: 'session=agent-cookie-value',
    'proxy-authorization': 'Basic YWdlbnQ6cHJveHk=',
    'x-api-key': 'agent-own-api-key',
  };
  const body = '{"query":"meeting notes","page_size":5}';
  const mark = proxy.logs.length;
  const res = await request(`${proxy.base}/p/notion/search?sort=desc`, { method: 'POST', headers: { ...passed, ...agentCredentials }, body });
  const text = await res.body.text();
  t.equal(res.statusCode, 200);
  t.equal(text, '{"object":"list","results":[]}', 'the upstream answer reaches the CLI');

  t.equal(gw.requests.length, 1, 'the upstream was called once');
  const seen = gw.requests[0];
  if (!seen) return;
  t.equal(seen.method, 'POST');
  t.equal(seen.url, '/v1/search?sort=desc', 'base path kept, path and query appended');
  t.equal(seen.headers['x-api-key'], `Key ${TOKEN}`, 'the upstream saw the real token in the configured header');
  t.equal(countHeader(seen, 'x-api-key'), 1, 'exactly one X-Api-Key: the agent\'s own was dropped, not merged');
  for (const name of ['authorization', 'cookie', 'proxy-authorization']) {
    t.equal(seen.headers[name], undefined, `the agent's ${name} did not reach the upstream`);
  }
  t.notOk(seen.rawHeaders.join('\n').includes('agent-'), 'no agent credential value appears anywhere upstream');
  for (const [name, value] of Object.entries(passed)) t.equal(seen.headers[name], value, `${name} passed unchanged`);
  t.equal(seen.headers.host, `127.0.0.1:${gw.port}`, "Host is the upstream's");
  t.equal(seen.body.toString(), body, 'body unchanged');

  const line = await accessLine(proxy, mark);
  t.equal(line.provider, 'notion', 'access log names the provider');
  t.equal(line.path, '/search', 'access log path is relative to the base');
  t.equal(line.status, 200);
  t.equal(line.upstreamStatus, 200);
  t.equal(line.outcome, 'ok');
});

t.test('header injection into Authorization (Bearer): one Authorization, the real one, re-read on every request', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    gh: { upstream: gw.url('/api'), tokenFile: join(dir, 'gh.token'), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } },
  }));
  const tokenFile = join(dir, 'gh.token');
  writeToken(tokenFile, 'tok-cliproxy-bearer-one-D4');
  const first = await send(`${proxy.base}/p/gh/user`, { method: 'GET', headers: { authorization: 'Bearer placeholder-from-shim', accept: 'application/vnd.github+json' } });
  t.equal(first.status, 200);
  noTokenIn(t, first, 'first');
  writeToken(tokenFile, 'tok-cliproxy-bearer-two-E5');
  const second = await send(`${proxy.base}/p/gh/user`, { method: 'GET', headers: { Authorization: 'token placeholder-from-shim' } });
  t.equal(second.status, 200);
  noTokenIn(t, second, 'second');

  t.equal(gw.requests.length, 2);
  t.equal(gw.requests[0]?.headers.authorization, 'Bearer tok-cliproxy-bearer-one-D4', 'first request: the file token');
  t.equal(gw.requests[1]?.headers.authorization, 'Bearer tok-cliproxy-bearer-two-E5', 'after the file changed: the new token, no restart');
  for (const seen of gw.requests) t.equal(countHeader(seen, 'authorization'), 1, 'a single Authorization header upstream');
  t.equal(gw.requests[0]?.headers.accept, 'application/vnd.github+json');
  t.equal(gw.requests[0]?.url, '/api/user');
});

t.test('query injection: the agent\'s same-named parameter is replaced, every other byte of the query kept', async (t) => {
  const TOKEN = 'tok-cliproxy-query+/=F6g7';
  rememberSecret(TOKEN);
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    maps: { upstream: gw.url('/maps/api'), tokenFile: join(dir, 'maps.token'), inject: { type: 'query', name: 'api_key' } },
  }));
  writeToken(join(dir, 'maps.token'), TOKEN);

  const agentPairs = ['q=hello%20world', 'tags=a+b', 'sym=%3D%26%2B', 'path=%2Fx%2Fy', 'empty=', 'flag', 'tilde=~x', 'API_KEY=upper-is-another-name', 'api_keyx=1'];
  const agentQuery = [agentPairs[0], 'api_key=agent-placeholder', ...agentPairs.slice(1, 5), 'api%5Fkey=agent-encoded-placeholder', ...agentPairs.slice(5)].join('&');
  const mark = proxy.logs.length;
  const resp = await rawExchange(
    proxy.port,
    `GET /p/maps/geocode/v2%20beta?${agentQuery} HTTP/1.1\r\nHost: 127.0.0.1:${proxy.port}\r\nConnection: close\r\n\r\n`,
  );
  t.equal(resp.status, 200);
  noTokenIn(t, resp, 'query injection');
  const seen = gw.requests[0];
  t.ok(seen, 'upstream called');
  if (!seen) return;
  const q = seen.url.indexOf('?');
  t.equal(seen.url.slice(0, q), '/maps/api/geocode/v2%20beta', 'path passed byte-identical under the base path');
  const upstreamPairs = seen.url.slice(q + 1).split('&');
  const isKey = (pair: string): boolean => decodeURIComponent(pair.split('=', 1)[0] ?? '') === 'api_key';
  t.same(
    upstreamPairs.filter((p) => !isKey(p)),
    agentPairs,
    'all other parameters byte-identical and in order (%20, +, %2F, empty, bare flag, other case)',
  );
  const keys = upstreamPairs.filter(isKey);
  t.equal(keys.length, 1, 'exactly one api_key parameter upstream');
  t.equal(new URLSearchParams(keys[0] ?? '').get('api_key'), TOKEN, 'it carries the real token (correctly encoded)');
  t.notOk(seen.url.includes('agent-'), 'no agent placeholder reached the upstream');
  t.equal(seen.headers.authorization, undefined, 'no Authorization invented for query injection');

  const bare = await send(`${proxy.base}/p/maps/ping`, { method: 'GET', headers: {} });
  t.equal(bare.status, 200);
  t.equal(gw.requests[1]?.url, `/maps/api/ping?api_key=${encodeURIComponent(TOKEN)}`, 'a request without a query gets just the token parameter');

  const line = await accessLine(proxy, mark, (l) => typeof l.path === 'string' && l.path.startsWith('/geocode'));
  t.equal(line.path, '/geocode/v2%20beta', 'the access log path is the path only');
  t.same(leakedSecrets(JSON.stringify(line)), [], 'the access line carries no token in any field');
  t.same(leakedSecrets(proxy.lines.join('\n')), [], 'no log line so far carries the token (path field included)');
});

t.test('query injection: a redirect that echoes the query does not hand the token to the CLI', async (t) => {
  const TOKEN = 'tok-cliproxy-qredirect-H8';
  rememberSecret(TOKEN);
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    maps: { upstream: gw.url('/maps/api'), tokenFile: join(dir, 'maps.token'), inject: { type: 'query', name: 'api_key' } },
  }));
  writeToken(join(dir, 'maps.token'), TOKEN);
  // Many APIs redirect to a canonical URL keeping the query they received, key included.
  gw.handle((req, res) => {
    res.writeHead(302, { location: req.url.replace('/list', '/list/canonical'), 'content-length': 0 });
    res.end();
  });
  const resp = await send(`${proxy.base}/p/maps/list?page=2`, { method: 'GET', headers: {} });
  t.equal(resp.status, 302, 'the redirect is returned, not followed');
  t.equal(gw.requests.length, 1, 'not followed');
  t.match(gw.requests[0]?.url ?? '', /api_key=/, 'the upstream got the key in its query (the scenario is real)');
  const location = String(resp.headers.location ?? '');
  t.ok(location.startsWith(`${proxy.base}/p/maps/list/canonical`), `the same-upstream Location goes back through the proxy (got ${location.slice(0, 60)})`);
  noTokenIn(t, resp, 'redirect echoing the query');
});

t.test('basic injection: user:password decoded is exactly the configured pair with the real token', async (t) => {
  const TOKEN = 'tok-cliproxy-basic-J9:k';
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    jira: { upstream: gw.url('/rest'), tokenFile: join(dir, 'jira.token'), inject: { type: 'basic', username: 'bot@example.com', password: '{token}' } },
  }));
  writeToken(join(dir, 'jira.token'), TOKEN);
  knownSecrets.add(Buffer.from(`bot@example.com:${TOKEN}`).toString('base64'));
  const resp = await send(`${proxy.base}/p/jira/api/2/myself`, {
    method: 'GET',
    headers: { authorization: 'Basic cGxhY2Vob2xkZXI6cGxhY2Vob2xkZXI=', accept: 'application/json' },
  });
  t.equal(resp.status, 200);
  noTokenIn(t, resp, 'basic');
  const seen = gw.requests[0];
  t.ok(seen);
  if (!seen) return;
  t.equal(countHeader(seen, 'authorization'), 1, 'one Authorization: the agent\'s own was dropped');
  const auth = String(seen.headers.authorization ?? '');
  t.match(auth, /^Basic [A-Za-z0-9+/]+=*$/, 'a Basic credential');
  t.equal(Buffer.from(auth.slice('Basic '.length), 'base64').toString('utf8'), `bot@example.com:${TOKEN}`, 'decoded user:password is right');
  t.equal(seen.url, '/rest/api/2/myself');
});

t.test('path and query pass through under the base path; a request cannot climb out of it', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    api: { upstream: gw.url('/base/v2'), tokenFile: join(dir, 'api.token'), inject: API_KEY },
    root: { upstream: `http://127.0.0.1:${gw.port}`, tokenFile: join(dir, 'api.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'api.token'), 'tok-cliproxy-paths-K1');
  const cases: Array<[string, string]> = [
    ['/p/api/pages/abc%2Fdef/x?y=1&z=%20', '/base/v2/pages/abc%2Fdef/x?y=1&z=%20'],
    ['/p/api/', '/base/v2/'],
    ['/p/api', '/base/v2'],
    ['/p/api?only=query', '/base/v2?only=query'],
    ['/p/api/a/./b/', '/base/v2/a/b/'],
    ['/p/root/v1/users/me', '/v1/users/me'],
    ['/p/root', '/'],
  ];
  for (const [path, upstreamPath] of cases) {
    const before = gw.requests.length;
    const resp = await rawExchange(proxy.port, `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${proxy.port}\r\nConnection: close\r\n\r\n`);
    t.equal(resp.status, 200, `${path}: 200`);
    t.equal(gw.requests[before]?.url, upstreamPath, `${path} → ${upstreamPath}`);
  }
  const escapes = ['/p/api/../../secret', '/p/api/%2e%2e/%2e%2e/secret', '/p/api/../v2-admin/users', '/p/api/..%2f..%2fsecret/../../x'];
  for (const path of escapes) {
    const before = gw.requests.length;
    const resp = await rawExchange(proxy.port, `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${proxy.port}\r\nConnection: close\r\n\r\n`);
    const reached = gw.requests.slice(before).map((r) => r.url);
    t.ok(
      reached.every((u) => u === '/base/v2' || u.startsWith('/base/v2/') || u.startsWith('/base/v2?')),
      `${path}: the upstream was not asked for anything outside /base/v2 (asked for ${JSON.stringify(reached)})`,
    );
    if (reached.length === 0) t.equal(resp.status, 404, `${path}: refused with 404`);
  }
});

t.test('hop-by-hop and forwarding headers never reach the upstream; API headers do; Set-Cookie never reaches the CLI', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    notion: { upstream: gw.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'notion.token'), 'tok-cliproxy-hop-L2');
  const respBody = '{"ok":true}';
  gw.handle((_req, res) => {
    res.setHeader('content-type', 'application/json; charset=utf-8');
    res.setHeader('content-length', Buffer.byteLength(respBody));
    res.setHeader('set-cookie', ['__cf_bm=upstream-cookie; HttpOnly; Secure', 'session=s3ss10n']);
    res.setHeader('x-ratelimit-remaining', '42');
    res.setHeader('etag', 'W/"etag-value-1"');
    res.setHeader('cache-control', 'private, max-age=0');
    res.setHeader('x-notion-request-id', 'req-abc');
    res.setHeader('connection', 'keep-alive, X-Hop-Response');
    res.setHeader('x-hop-response', 'must-not-pass');
    res.end(respBody);
  });
  const reqBody = '{"parent":{"page_id":"p1"}}';
  const conn = await RawConnection.open(proxy.port);
  t.teardown(() => conn.destroy());
  await conn.write(
    'POST /p/notion/pages HTTP/1.1\r\n' +
      `Host: 127.0.0.1:${proxy.port}\r\n` +
      'Content-Type: application/json\r\n' +
      `Content-Length: ${Buffer.byteLength(reqBody)}\r\n` +
      'Accept: application/json\r\n' +
      'User-Agent: ntn/0.4.2\r\n' +
      'Notion-Version: 2022-06-28\r\n' +
      'Connection: keep-alive, X-Hop-Secret\r\n' +
      'X-Hop-Secret: hop-value\r\n' +
      'Keep-Alive: timeout=99\r\n' +
      'TE: trailers\r\n' +
      'Trailer: X-Late\r\n' +
      'Upgrade: h2c\r\n' +
      'Proxy-Connection: keep-alive\r\n' +
      'X-Forwarded-For: 10.0.0.1\r\n' +
      'X-Forwarded-Host: evil.example\r\n' +
      'X-Forwarded-Proto: https\r\n' +
      'Forwarded: for=10.0.0.1\r\n' +
      'Authorization: Bearer agent-own-hop\r\n' +
      'Cookie: a=agent-own-cookie\r\n' +
      'Proxy-Authorization: Basic agent-own-proxy\r\n' +
      'X-API-KEY: agent-own-key\r\n' +
      '\r\n' +
      reqBody,
  );
  const resp = await conn.readResponse();
  t.equal(resp.status, 200);
  t.equal(resp.body, respBody);
  const seen = gw.requests[0];
  t.ok(seen, 'upstream called');
  if (!seen) return;
  for (const name of [
    'x-hop-secret',
    'keep-alive',
    'te',
    'trailer',
    'upgrade',
    'proxy-connection',
    'x-forwarded-for',
    'x-forwarded-host',
    'x-forwarded-proto',
    'forwarded',
    'cookie',
    'proxy-authorization',
    'authorization',
  ]) {
    t.equal(seen.headers[name], undefined, `upstream did not get ${name}`);
  }
  t.notMatch(String(seen.headers.connection ?? ''), /x-hop-secret/i, "the agent's Connection list is not forwarded");
  t.equal(seen.headers['x-api-key'], 'Key tok-cliproxy-hop-L2', 'the injected header replaced the agent\'s (case-insensitively)');
  t.equal(countHeader(seen, 'x-api-key'), 1);
  t.equal(seen.headers['notion-version'], '2022-06-28', 'API-specific headers pass');
  t.equal(seen.headers.accept, 'application/json');
  t.equal(seen.headers['user-agent'], 'ntn/0.4.2');
  t.equal(seen.headers['content-type'], 'application/json');
  t.equal(seen.body.toString(), reqBody);

  t.equal(resp.headers['set-cookie'], undefined, 'Set-Cookie dropped');
  t.equal(resp.headers['x-hop-response'], undefined, 'a header the upstream named in Connection dropped');
  t.equal(resp.headers['x-ratelimit-remaining'], '42', 'X-RateLimit-Remaining passes');
  t.equal(resp.headers.etag, 'W/"etag-value-1"', 'ETag passes');
  t.equal(resp.headers['content-type'], 'application/json; charset=utf-8', 'Content-Type passes');
  t.equal(resp.headers['cache-control'], 'private, max-age=0');
  t.equal(resp.headers['x-notion-request-id'], 'req-abc', 'other API headers pass');

  // The same connection is still usable, and a chunked upload passes intact.
  await conn.write(
    'POST /p/notion/blocks HTTP/1.1\r\n' +
      `Host: 127.0.0.1:${proxy.port}\r\n` +
      'Content-Type: text/plain\r\n' +
      'Transfer-Encoding: chunked\r\n' +
      '\r\n' +
      '5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n',
  );
  const chunked = await conn.readResponse();
  t.equal(chunked.status, 200, 'a chunked request on the kept-alive connection');
  t.equal(gw.requests[1]?.body.toString(), 'hello, world', 'chunked body reached the upstream intact');
  t.equal(gw.requests[1]?.headers['x-api-key'], 'Key tok-cliproxy-hop-L2', 'the second request on the connection got the token too');
});

t.test('redirects are returned, never followed; same-upstream Locations go back through the proxy', async (t) => {
  const TOKEN = 'tok-cliproxy-redirect-M3';
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    notion: { upstream: gw.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'notion.token'), TOKEN);
  const other = await MockGateway.start();
  t.teardown(() => other.close());
  const elsewhere = `http://localhost:${other.port}/landing?from=upstream&x=%20y`;
  gw.handle((req, res) => {
    const redirect = (status: number, location: string): void => {
      res.writeHead(status, { location, 'content-type': 'text/plain', 'content-length': 2 });
      res.end('->');
    };
    if (req.url === '/v1/away') return redirect(302, elsewhere);
    if (req.url === '/v1/upload') return redirect(307, elsewhere);
    if (req.url === '/v1/same-absolute') return redirect(302, `http://127.0.0.1:${gw.port}/v1/next?page=2&q=a+b`);
    if (req.url === '/v1/same-relative') return redirect(301, '/v1/moved/here');
    json(res, 200, { at: req.url });
  });

  const away = await send(`${proxy.base}/p/notion/away`, { method: 'GET', headers: {} });
  t.equal(away.status, 302, 'a 302 to another origin is returned to the CLI');
  t.equal(away.headers.location, elsewhere, 'its Location unchanged');
  noTokenIn(t, away, '302 away');
  const upload = await send(`${proxy.base}/p/notion/upload`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"file":"x"}' });
  t.equal(upload.status, 307, 'a 307 for a POST is returned too');
  t.equal(upload.headers.location, elsewhere);
  t.equal(other.requests.length, 0, 'the other origin never received a request (nothing was followed, no token sent there)');
  t.equal(gw.requests.length, 2, 'one upstream request per CLI request');

  const abs = await send(`${proxy.base}/p/notion/same-absolute`, { method: 'GET', headers: {} });
  t.equal(abs.status, 302);
  t.equal(abs.headers.location, `${proxy.base}/p/notion/next?page=2&q=a+b`, 'an absolute Location on the upstream is rewritten to the proxy');
  const rel = await send(`${proxy.base}/p/notion/same-relative`, { method: 'GET', headers: {} });
  t.equal(rel.status, 301);
  t.equal(rel.headers.location, `${proxy.base}/p/notion/moved/here`, 'a path-only Location on the upstream is rewritten to the proxy');
  t.equal(gw.requests.length, 4, 'the upstream\'s own redirects were not followed either');
  noTokenIn(t, abs, 'same absolute');
  noTokenIn(t, rel, 'same relative');

  // The CLI follows the rewritten Location itself, through the proxy, and gets the token injected again.
  const followed = await send(String(abs.headers.location), { method: 'GET', headers: {} });
  t.equal(followed.status, 200);
  t.equal(gw.requests[4]?.url, '/v1/next?page=2&q=a+b', 'following the rewritten Location reaches the upstream target');
  t.equal(gw.requests[4]?.headers['x-api-key'], `Key ${TOKEN}`, 'with the token injected by the proxy');
  t.equal(other.requests.length, 0);
});

t.test('missing, empty or malformed token → 503 token_unavailable, the upstream never called', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    absent: { upstream: gw.url('/a'), tokenFile: join(dir, 'absent.token'), inject: API_KEY },
    empty: { upstream: gw.url('/e'), tokenFile: join(dir, 'empty.token'), inject: { type: 'query', name: 'key' } },
    spaced: { upstream: gw.url('/s'), tokenFile: join(dir, 'spaced.token'), inject: { type: 'basic', username: 'u', password: '{token}' } },
    dir: { upstream: gw.url('/d'), tokenFile: join(dir, 'dir.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'empty.token'), '', true);
  writeToken(join(dir, 'spaced.token'), 'tok-cliproxy has-space-N4');
  mkdirSync(join(dir, 'dir.token'));
  const expected: Record<string, string> = { absent: 'missing', empty: 'empty', spaced: 'malformed', dir: 'missing' };
  for (const [provider, problem] of Object.entries(expected)) {
    for (const method of ['GET', 'POST']) {
      const mark = proxy.logs.length;
      const resp = await send(`${proxy.base}/p/${provider}/thing?x=1`, method === 'POST' ? { body: '{"a":1}' } : { method, headers: {} });
      assertJsonError(t, resp, 503, 'token_unavailable', `${provider} ${method}`);
      noTokenIn(t, resp, `${provider} ${method}`);
      const line = await accessLine(proxy, mark);
      t.equal(line.tokenProblem, problem, `${provider}: access log says why (${problem})`);
      t.equal(line.status, 503);
    }
  }
  t.equal(gw.requests.length, 0, 'fail closed: the upstream was never called');
});

t.test('routes: /healthz, unknown and malformed providers, other paths, refused methods', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    notion: { upstream: gw.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: API_KEY, commands: [{ name: 'ntn', env: { NOTION_API_BASE_URL: '{baseUrl}' } }] },
  }));
  writeToken(join(dir, 'notion.token'), 'tok-cliproxy-routes-P5');

  const health = await send(`${proxy.base}/healthz`, { method: 'GET', headers: {} });
  t.equal(health.status, 200);
  t.match(String(health.headers['content-type']), /^application\/json/);
  t.same(JSON.parse(health.body), { status: 'ok', providers: 1, version: VERSION }, '/healthz: status, provider count, version');
  t.notOk(health.body.includes(dir) || health.body.includes(String(gw.port)), '/healthz shows no paths and no upstream');

  for (const name of ['nope', 'Notion', '__proto__', 'constructor', 'toString']) {
    const resp = await send(`${proxy.base}/p/${name}/x`, { method: 'GET', headers: {} });
    assertJsonError(t, resp, 404, 'unknown_provider', `provider ${name}`);
  }
  for (const name of ['bad%20name', 'bad$name', 'a'.repeat(65), 'no%2Fslash']) {
    const resp = await send(`${proxy.base}/p/${name}/x`, { method: 'GET', headers: {} });
    assertJsonError(t, resp, 404, ['unknown_provider', 'not_found'], `malformed provider ${name.slice(0, 12)}`);
  }
  for (const path of ['/', '/.well-known/x', '/.well-known/oauth-authorization-server', '/p', '/p/', '/pnotion/x', '/healthz/extra', '/register']) {
    const resp = await send(`${proxy.base}${path}`, { method: 'GET', headers: {} });
    assertJsonError(t, resp, 404, 'not_found', `GET ${path}`);
  }
  assertJsonError(t, await send(`${proxy.base}/healthz`, { body: '{}' }), 405, 'method_not_allowed', 'POST /healthz');

  const trace = await rawExchange(proxy.port, `TRACE /p/notion/x HTTP/1.1\r\nHost: 127.0.0.1:${proxy.port}\r\nConnection: close\r\n\r\n`);
  assertJsonError(t, trace, 405, 'method_not_allowed', 'TRACE');
  const allow = String(trace.headers.allow ?? '');
  t.ok(allow, 'TRACE: a 405 carries Allow (RFC 9110 §15.5.6)');
  t.notMatch(allow, /TRACE|CONNECT/, 'Allow does not list TRACE or CONNECT');

  // CONNECT is TLS mode's (SPEC §10), for agent UIDs only: with no peer check configured
  // nobody's UID can be told to be an agent's, so it is refused (cli-proxy-tls.test.ts has the rest).
  for (const target of ['/p/notion/x', 'api.notion.com:443']) {
    const connect = await tryRaw(proxy.port, `CONNECT ${target} HTTP/1.1\r\nHost: 127.0.0.1:${proxy.port}\r\n\r\n`);
    if (connect instanceof Error) {
      t.fail(`CONNECT ${target}: expected 403 forbidden_peer, the connection was dropped without an answer (${connect.message.slice(0, 80)})`);
    } else {
      assertJsonError(t, connect, 403, 'forbidden_peer', `CONNECT ${target}`);
    }
  }
  t.equal(gw.requests.length, 0, 'the upstream was never called');
});

t.test('catalog: invalid files keep the last good one; hot reload adds and removes providers', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    old: { upstream: gw.url('/old'), tokenFile: join(dir, 'old.token'), inject: API_KEY, commands: [{ name: 'oldcli' }] },
  }));
  writeToken(join(dir, 'old.token'), 'tok-cliproxy-catalog-old-Q6');
  writeToken(join(dir, 'fresh.token'), 'tok-cliproxy-catalog-fresh-R7');
  writeToken(join(dir, 'added.token'), 'tok-cliproxy-catalog-added-S8');
  const old: ProviderSpec = { upstream: gw.url('/old'), tokenFile: join(dir, 'old.token'), inject: API_KEY, commands: [{ name: 'oldcli' }] };
  const fresh = (over: Partial<ProviderSpec>): ProviderSpec => ({ upstream: gw.url('/fresh'), tokenFile: join(dir, 'fresh.token'), inject: API_KEY, ...over });

  const health = async (): Promise<{ status: string; providers: number }> =>
    JSON.parse((await send(`${proxy.base}/healthz`, { method: 'GET', headers: {} })).body) as { status: string; providers: number };
  const serves = async (provider: string): Promise<number> => (await send(`${proxy.base}/p/${provider}/ping`, { method: 'GET', headers: {} })).status;

  t.same(await health(), { status: 'ok', providers: 1, version: VERSION });
  t.equal(await serves('old'), 200);

  const invalid: Array<[string, unknown]> = [
    ['bad JSON', `{"old": ${JSON.stringify(old)}, "fresh": {`],
    ['http to a non-loopback host', { old, fresh: fresh({ upstream: 'http://api.example.com/v1' }) }],
    ['http to a loopback-looking name', { old, fresh: fresh({ upstream: `http://127.0.0.1.evil.example:${gw.port}/v1` }) }],
    ['relative tokenFile', { old, fresh: fresh({ tokenFile: 'cli-proxy/fresh.token' }) }],
    ['header value without {token}', { old, fresh: fresh({ inject: { type: 'header', name: 'X-Api-Key', value: 'Key static' } }) }],
    ['two providers declaring the same command', { old, fresh: fresh({ commands: [{ name: 'oldcli' }] }) }],
    ['inject into Host', { old, fresh: fresh({ inject: { type: 'header', name: 'Host', value: '{token}' } }) }],
  ];
  for (const [what, content] of invalid) {
    const mark = proxy.logs.length;
    writeJsonAtomic(proxy.configPath, content);
    const rejected = await waitForLogAfter(proxy, mark, (l) => l.msg === 'catalog rejected; keeping last good');
    t.equal(rejected.providers, 1, `${what}: rejected, the last good catalog (1 provider) stays`);
    t.same(await health(), { status: 'degraded', providers: 1, version: VERSION }, `${what}: /healthz degraded`);
    t.equal(await serves('old'), 200, `${what}: the old provider still serves`);
    assertJsonError(t, await send(`${proxy.base}/p/fresh/ping`, { method: 'GET', headers: {} }), 404, 'unknown_provider', `${what}: nothing of the bad file serves`);
  }

  let mark = proxy.logs.length;
  const added: ProviderSpec = { upstream: gw.url('/added'), tokenFile: join(dir, 'added.token'), inject: { type: 'query', name: 'key' } };
  writeJsonAtomic(proxy.configPath, { old, added });
  await waitForLogAfter(proxy, mark, (l) => l.msg === 'catalog loaded' && l.providers === 2);
  t.same(await health(), { status: 'ok', providers: 2, version: VERSION }, 'a good file restores ok');
  t.equal(await serves('added'), 200, 'an added provider serves without restart');
  t.equal(gw.requests.at(-1)?.url, `/added/ping?key=tok-cliproxy-catalog-added-S8`);
  t.equal(await serves('old'), 200);

  mark = proxy.logs.length;
  writeJsonAtomic(proxy.configPath, { added });
  await waitForLogAfter(proxy, mark, (l) => l.msg === 'catalog loaded' && l.providers === 1);
  assertJsonError(t, await send(`${proxy.base}/p/old/ping`, { method: 'GET', headers: {} }), 404, 'unknown_provider', 'a removed provider 404s at once');
  t.equal(await serves('added'), 200);
  t.same(await health(), { status: 'ok', providers: 1, version: VERSION });
  t.equal(gw.requests.filter((r) => r.url.startsWith('/fresh')).length, 0, 'no rejected provider ever reached its upstream');
});

t.test('catalog invalid at startup: the proxy starts degraded and empty, then loads a good file', async (t) => {
  const gw = await MockGateway.start();
  t.teardown(() => gw.close());
  const stateDir = tempDir('ac-cli-proxy-', t);
  const dir = partDir(stateDir, 'cli-proxy');
  writeToken(join(dir, 'late.token'), 'tok-cliproxy-startup-T9');
  const proxy = await startProxy(t, 'cli-proxy', { stateDir, config: '{ "late": ' });
  await proxy.waitForLog((l) => l.msg === 'catalog rejected; keeping last good');
  const h1 = JSON.parse((await send(`${proxy.base}/healthz`, { method: 'GET', headers: {} })).body) as unknown;
  t.same(h1, { status: 'degraded', providers: 0, version: VERSION }, 'degraded, no providers');
  const mark = proxy.logs.length;
  writeJsonAtomic(proxy.configPath, { late: { upstream: gw.url('/late'), tokenFile: join(dir, 'late.token'), inject: API_KEY } });
  await waitForLogAfter(proxy, mark, (l) => l.msg === 'catalog loaded' && l.providers === 1);
  t.equal((await send(`${proxy.base}/p/late/x`, { method: 'GET', headers: {} })).status, 200, 'serves once the file is fixed');
  t.equal(gw.requests[0]?.headers['x-api-key'], 'Key tok-cliproxy-startup-T9');
});

t.test('Host and Origin hardening, before routing', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    notion: { upstream: gw.url('/v1'), tokenFile: join(dir, 'notion.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'notion.token'), 'tok-cliproxy-host-U1');
  const raw = (path: string, lines: string[]): string => `GET ${path} HTTP/1.1\r\n${[...lines, 'Connection: close'].join('\r\n')}\r\n\r\n`;
  const wrongPort = proxy.port === 65535 ? 65534 : proxy.port + 1;
  for (const host of [`evil.example:${proxy.port}`, 'evil.example', `127.0.0.1:${wrongPort}`, `localhost.evil.example:${proxy.port}`]) {
    assertJsonError(t, await rawExchange(proxy.port, raw('/p/notion/x', [`Host: ${host}`])), 403, 'forbidden_host', `Host ${host}`);
  }
  assertJsonError(t, await rawExchange(proxy.port, raw('/healthz', [`Host: evil.example:${proxy.port}`])), 403, 'forbidden_host', '/healthz with an evil Host');
  assertJsonError(t, await rawExchange(proxy.port, 'GET /p/notion/x HTTP/1.0\r\n\r\n'), 403, 'forbidden_host', 'HTTP/1.0 without Host');
  for (const origin of ['http://evil.example', 'null', 'https://127.0.0.1.evil.example', 'not a url']) {
    const resp = await send(`${proxy.base}/p/notion/x`, { method: 'GET', headers: { origin } });
    assertJsonError(t, resp, 403, 'forbidden_origin', `Origin ${origin}`);
  }
  t.equal(gw.requests.length, 0, 'no refused request reached the upstream');
  for (const host of [`localhost:${proxy.port}`, `[::1]:${proxy.port}`]) {
    t.equal((await rawExchange(proxy.port, raw('/p/notion/x', [`Host: ${host}`]))).status, 200, `Host ${host} accepted`);
  }
  const loopbackOrigin = await send(`${proxy.base}/p/notion/x`, { method: 'GET', headers: { origin: 'http://localhost:5173' } });
  t.equal(loopbackOrigin.status, 200, 'a loopback Origin passes');
  t.equal(gw.requests.length, 3);
  t.equal(gw.requests[2]?.headers.origin, undefined, 'the Origin itself is not forwarded');
});

t.test('request bodies stream upstream byte-identical; a declared body over the limit is 413', async (t) => {
  const LIMIT = 5 * MiB + 512 * KiB;
  const { gw, proxy, dir } = await setup(
    t,
    (gw, dir) => ({ files: { upstream: gw.url('/upload'), tokenFile: join(dir, 'files.token'), inject: API_KEY } }),
    ['--body-limit-bytes', String(LIMIT)],
  );
  writeToken(join(dir, 'files.token'), 'tok-cliproxy-body-V2');
  gw.handle((req, res) => json(res, 200, { got: req.body.length }));
  const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

  const five = randomBytes(5 * MiB);
  const r1 = await request(`${proxy.base}/p/files/put`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: five });
  t.equal(r1.statusCode, 200);
  t.same(await r1.body.json(), { got: five.length });
  t.equal(gw.requests[0]?.body.length, five.length, '5 MiB arrived');
  t.equal(sha(gw.requests[0]?.body ?? Buffer.alloc(0)), sha(five), 'byte-identical (sha256)');
  t.equal(gw.requests[0]?.headers['content-length'], String(five.length), 'declared length kept');

  // Chunked upload from a stream (no Content-Length).
  const pieces = Array.from({ length: 40 }, () => randomBytes(128 * KiB));
  const r2 = await request(`${proxy.base}/p/files/stream`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: Readable.from(pieces) });
  t.equal(r2.statusCode, 200);
  await r2.body.dump();
  t.equal(sha(gw.requests[1]?.body ?? Buffer.alloc(0)), sha(Buffer.concat(pieces)), 'a chunked 5 MiB upload arrives byte-identical');

  const exact = randomBytes(LIMIT);
  const r3 = await request(`${proxy.base}/p/files/exact`, { method: 'POST', body: exact });
  t.equal(r3.statusCode, 200, 'a body of exactly the limit passes');
  await r3.body.dump();
  t.equal(gw.requests[2]?.body.length, LIMIT);

  // Over the limit, declared: the answer comes while the client is still uploading.
  const before = gw.requests.length;
  const conn = await RawConnection.open(proxy.port);
  t.teardown(() => conn.destroy());
  await conn.write(
    `POST /p/files/big HTTP/1.1\r\nHost: 127.0.0.1:${proxy.port}\r\nContent-Type: application/octet-stream\r\nContent-Length: ${LIMIT + 1}\r\n\r\n`,
  );
  await conn.write(randomBytes(64 * KiB));
  const big = await conn.readResponse();
  assertJsonError(t, big, 413, 'payload_too_large', 'declared over the limit');
  t.equal(gw.requests.length, before, 'the upstream never saw the oversized request');
});

/** Opens an SSE response at the mock upstream and hands the sender to the test. */
function sseHandle(gw: MockGateway): Promise<{ send: (data: string) => void; end: () => void; res: ServerResponse; seen: SeenRequest }> {
  const ready = deferred<{ send: (data: string) => void; end: () => void; res: ServerResponse; seen: SeenRequest }>();
  gw.handle((seen, res) => {
    const s = sse(res, { 'x-ratelimit-remaining': '9' });
    ready.resolve({ ...s, res, seen });
  });
  return ready.promise;
}

t.test('streaming: headers at once, each chunk reaches the CLI before the upstream sends the next', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    llm: { upstream: gw.url('/v1'), tokenFile: join(dir, 'llm.token'), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } },
  }));
  writeToken(join(dir, 'llm.token'), 'tok-cliproxy-sse-W3');
  const upstream = sseHandle(gw);
  const res = await within(
    request(`${proxy.base}/p/llm/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'text/event-stream' }, body: '{"stream":true}' }),
    10_000,
    'response headers while the upstream has sent no event yet',
  );
  const up = await upstream;
  t.equal(res.statusCode, 200);
  t.match(String(res.headers['content-type']), /^text\/event-stream/);
  t.equal(res.headers['x-ratelimit-remaining'], '9');
  const reader = new StreamReader(res.body);
  t.equal(reader.received, 0, 'headers arrived before any event');
  const events = ['data: {"delta":"Hel"}\n\n', ': ping\n\n', 'data: {"delta":"lo ü ✓"}\n\n', `data: ${'z'.repeat(50_000)}\n\n`, 'data: [DONE]\n\n'];
  const order: string[] = [];
  let expected = 0;
  for (const [i, ev] of events.entries()) {
    up.send(ev);
    order.push(`sent ${i}`);
    expected += Buffer.byteLength(ev);
    await reader.waitForBytes(expected);
    order.push(`received ${i}`);
  }
  up.end();
  t.same(await reader.ended, { kind: 'end' });
  t.same(order, events.flatMap((_, i) => [`sent ${i}`, `received ${i}`]), 'each chunk arrived before the next was sent');
  t.ok(reader.bytes().equals(Buffer.from(events.join(''))), 'byte-identical');
});

t.test('a CLI that goes away mid-stream: the upstream sees the close', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    llm: { upstream: gw.url('/v1'), tokenFile: join(dir, 'llm.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'llm.token'), 'tok-cliproxy-abort-X4');
  const upstream = sseHandle(gw);
  const mark = proxy.logs.length;
  const res = await request(`${proxy.base}/p/llm/events`, { method: 'GET', headers: { accept: 'text/event-stream' } });
  const up = await upstream;
  const reader = new StreamReader(res.body);
  up.send('data: first\n\n');
  await reader.waitForText('data: first');
  t.notOk(up.seen.wasAborted(), 'the upstream request is open while the CLI reads');
  res.body.destroy();
  await within(up.seen.aborted, 10_000, 'the upstream to see the close');
  t.ok(up.seen.wasAborted(), 'the upstream saw its request go away');
  const line = await accessLine(proxy, mark, (l) => l.path === '/events');
  t.equal(line.outcome, 'client_closed', 'access log: client_closed');
});

t.test('a 224 MiB download to a slow reader keeps the proxy RSS flat', async (t) => {
  const { gw, proxy, dir } = await setup(t, (gw, dir) => ({
    dl: { upstream: gw.url('/files'), tokenFile: join(dir, 'dl.token'), inject: API_KEY },
  }));
  writeToken(join(dir, 'dl.token'), 'tok-cliproxy-rss-Y5');
  const pid = proxy.child.pid;
  if (pid === undefined) throw new Error('no pid');

  const CHUNK = 64 * KiB;
  const blocks = Array.from({ length: 8 }, () => randomBytes(CHUNK));
  let written = 0;
  let upstreamHash = createHash('sha256');
  /** The upstream writes as fast as the proxy takes the bytes, honouring backpressure. */
  const serve = (total: number) => async (_req: SeenRequest, res: ServerResponse): Promise<void> => {
    written = 0;
    upstreamHash = createHash('sha256');
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
    const closed = once(res, 'close');
    for (let i = 0; written < total; i++) {
      const b = blocks[i % blocks.length] as Buffer;
      upstreamHash.update(b);
      written += b.length;
      if (!res.write(b)) {
        await Promise.race([once(res, 'drain'), closed]);
        if (res.destroyed) return;
      }
    }
    res.end();
  };
  const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

  const idle = rssBytes(pid);
  // Warm up (agent, buffers, JIT) with a smaller transfer read at full speed.
  gw.handle(serve(16 * MiB));
  const warm = await request(`${proxy.base}/p/dl/warm.bin`, { method: 'GET', headers: {} });
  t.equal(warm.statusCode, 200);
  await warm.body.dump({ limit: 32 * MiB });

  const TOTAL = 224 * MiB;
  gw.handle(serve(TOTAL));
  const baseline = rssBytes(pid);
  let peak = baseline;
  let got = 0;
  let maxLead = 0;
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, rssBytes(pid));
    } catch {
      // The process went away; the transfer assertions will say so.
    }
    maxLead = Math.max(maxLead, written - got);
  }, 20);
  t.teardown(() => clearInterval(sampler));

  const started = Date.now();
  const res = await request(`${proxy.base}/p/dl/big.bin`, { method: 'GET', headers: {} });
  t.equal(res.statusCode, 200);
  t.equal(res.headers['content-length'], String(TOTAL));
  const hash = createHash('sha256');
  // The slow reader: a pause after every 4 MiB. A pause in which the upstream stops making
  // progress shows the reader, not the upstream, sets the pace (and that nothing between
  // them kept reading on its behalf: a buffering proxy never stalls the upstream).
  const PAUSE_EVERY = 4 * MiB;
  let pauses = 0;
  let stalledPauses = 0;
  let nextPause = PAUSE_EVERY;
  for await (const chunk of res.body) {
    const buf = chunk as Buffer;
    got += buf.length;
    hash.update(buf);
    if (got >= nextPause && written < TOTAL) {
      nextPause += PAUSE_EVERY;
      pauses++;
      await sleep(40);
      const mid = written;
      await sleep(40);
      if (written === mid && written < TOTAL) stalledPauses++;
    }
  }
  clearInterval(sampler);
  peak = Math.max(peak, rssBytes(pid));
  const seconds = (Date.now() - started) / 1000;
  const growth = peak - baseline;
  t.comment(
    `RSS idle ${(idle / MiB).toFixed(1)} MiB, baseline after a 16 MiB warm-up ${(baseline / MiB).toFixed(1)} MiB, ` +
      `peak ${(peak / MiB).toFixed(1)} MiB, peak growth ${(growth / MiB).toFixed(1)} MiB over a ${TOTAL / MiB} MiB download ` +
      `in ${seconds.toFixed(1)} s; upstream stalled by the reader in ${stalledPauses} of ${pauses} pauses; ` +
      `max upstream lead over the reader ${(maxLead / MiB).toFixed(1)} MiB`,
  );
  t.equal(got, TOTAL, 'every byte arrived');
  t.equal(hash.digest('hex'), upstreamHash.digest('hex'), 'sha256 matches what the upstream sent');
  t.ok(stalledPauses > 0, `the reader was slower than the upstream: the upstream stalled during ${stalledPauses} of ${pauses} reader pauses`);
  t.ok(maxLead < 96 * MiB, `the upstream never ran far ahead of the reader (max lead ${(maxLead / MiB).toFixed(1)} MiB)`);
  t.ok(growth < 64 * MiB, `proxy RSS growth stayed under 64 MiB (was ${(growth / MiB).toFixed(1)} MiB)`);
});

checkNoLeaks(t);
