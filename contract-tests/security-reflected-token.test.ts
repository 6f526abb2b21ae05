import type { ServerResponse } from 'node:http';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, knownSecrets, waitForLogAfter, type LogLine } from '../test/support/cli-proc.js';
import { json, type MockGateway, type SeenRequest } from '../test/support/mock-gateway.js';
import { forwarderRig, startRig } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';

/*
 * Issue 21, item 2: a SaaS that reflects the request in its response headers (pagination
 * `Link`s repeating the query, `Content-Location`, `Refresh`, API-specific echo headers)
 * handed the injected token back to the agent. Here a hostile upstream reflects everything
 * it received, in every spelling, through the cli-proxy (each inject type) and the
 * forwarder; no response header the agent receives may hold the token in any encoding.
 */

// Characters that each encoding spells differently (`+/=` percent-encoded, `~!` form-encoded).
const TOKENS = {
  header: 'tok-reflect-HDR+a/b=c~d!Q7x9Lm2Pz4',
  query: 'tok-reflect-QRY+e/f=g~h!R8y0Nn3Qa5',
  basic: 'tok-reflect-BAS+i/j=k~l!S9z1Oo4Rb6',
  basicUser: 'tok-reflect-USR+m/n=o~p!T0a2Pp5Sc7',
  forwarder: 'tok-reflect-FWD+q/r=s~t!U1b3Qq6Td8',
} as const;

const b64 = (s: string): string => Buffer.from(s).toString('base64');
const b64url = (s: string): string => Buffer.from(s).toString('base64url');

/** Every way a header could carry `token`: raw, URL- and form-encoded, and in basic-auth base64. */
function spellings(token: string, basicPair?: string): string[] {
  const encoded = encodeURIComponent(token);
  const form = new URLSearchParams({ t: token }).toString().slice(2);
  const pairs = [token, `${token}:`, `:${token}`, ...(basicPair ? [basicPair] : [])];
  return [
    token,
    encoded,
    encoded.replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()),
    form,
    ...pairs.flatMap((p) => [b64(p), b64(p).replace(/=+$/, ''), b64url(p)]),
  ];
}

for (const token of Object.values(TOKENS)) for (const s of spellings(token)) knownSecrets.add(s);
knownSecrets.add(b64(`api:${TOKENS.basic}`));
knownSecrets.add(b64(`${TOKENS.basicUser}:`));

/** The response's headers as the agent received them, names and values, one `name: value` a line. */
function headerLines(rawHeaders: readonly string[]): string[] {
  const lines: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) lines.push(`${rawHeaders[i]}: ${rawHeaders[i + 1]}`);
  return lines;
}

/** Fetches `url` and returns the status and the raw response headers (the body is read and ignored). */
async function fetchHeaders(url: string, headers: Record<string, string> = {}): Promise<{ status: number; raw: string[]; headers: Record<string, string | string[] | undefined> }> {
  const res = await request(url, { method: 'GET', headers });
  await res.body.text();
  const raw: string[] = [];
  for (const [name, value] of Object.entries(res.headers)) {
    for (const v of Array.isArray(value) ? value : [value]) if (v !== undefined) raw.push(name, v);
  }
  return { status: res.statusCode, raw, headers: res.headers };
}

/**
 * The hostile SaaS: reflects the request URL (query token), the credential header it got
 * (header token, basic base64) and the token it can read from them, spelled every way,
 * in headers the agent might be handed. `token` is what the test injected, so the SaaS can
 * spell it in encodings the request did not carry.
 */
function reflect(req: SeenRequest, res: ServerResponse, token: string, credential: string, extra: Record<string, string> = {}): void {
  const self = `http://${req.headers.host ?? ''}${req.url}`;
  const spelled = spellings(token);
  const headers: Record<string, string | string[]> = {
    'content-type': 'application/json',
    'x-ratelimit-remaining': '41',
    link: [`<${self}&page=2>; rel="next"`, `<${self}>; rel="self"; title="${credential}"`],
    'content-location': self,
    refresh: `0; url=${self}`,
    'x-echo-authorization': credential,
    // Headers on the cli-proxy's allow-list and the forwarder's, carrying the token.
    'x-ratelimit-echo': credential,
    'x-github-request-id': spelled.join(' '),
    'x-amz-meta-echo': spelled.slice(4).join(','),
    etag: `"${spelled[1] ?? ''}"`,
    'cache-control': `private, x-echo="${spelled[3] ?? ''}"`,
    'www-authenticate': `Basic realm="${credential}"`,
    'mcp-session-id': `sess-${spelled[4] ?? ''}`,
    ...extra,
  };
  for (const [i, s] of spelled.entries()) headers[`x-ratelimit-spelling-${i}`] = s;
  json(res, 200, { ok: true }, headers);
}

function assertNoToken(t: TapTest, got: { raw: string[] }, token: string, basicPair: string | undefined, what: string): void {
  const needles = spellings(token, basicPair);
  const leaked = headerLines(got.raw).filter((line) => needles.some((n) => line.includes(n)));
  t.same(
    leaked.map((l) => l.slice(0, l.indexOf(':'))),
    [],
    `${what}: no response header holds the token in any spelling`,
  );
}

/** The warning a proxy logs for a response whose token-holding headers it dropped: names only. */
function droppedWarning(lines: readonly LogLine[], mark: number): LogLine | undefined {
  return lines.slice(mark).find((l) => l.msg === 'dropped response headers holding the token');
}

interface CliCase {
  provider: string;
  token: string;
  inject: Record<string, string>;
  /** What the SaaS receives as the credential, spelled as it arrives. */
  credential: (req: SeenRequest) => string;
  basicPair?: string;
}

const CASES: CliCase[] = [
  {
    provider: 'hdr',
    token: TOKENS.header,
    inject: { type: 'header', name: 'X-Api-Key', value: 'Key {token}' },
    credential: (req) => String(req.headers['x-api-key'] ?? ''),
  },
  {
    provider: 'qry',
    token: TOKENS.query,
    inject: { type: 'query', name: 'api_key' },
    credential: (req) => req.url,
  },
  {
    provider: 'bas',
    token: TOKENS.basic,
    inject: { type: 'basic', username: 'api', password: '{token}' },
    credential: (req) => String(req.headers.authorization ?? ''),
    basicPair: `api:${TOKENS.basic}`,
  },
  {
    provider: 'usr',
    token: TOKENS.basicUser,
    inject: { type: 'basic', username: '{token}', password: '' },
    credential: (req) => String(req.headers.authorization ?? ''),
    basicPair: `${TOKENS.basicUser}:`,
  },
];

t.test('cli-proxy: a SaaS reflecting the request in its headers hands no token back, whatever the inject type', async (t) => {
  const { upstream: gw, proc: proxy } = await startRig<MockGateway>(t, 'cli-proxy', {
    tokens: Object.fromEntries(CASES.map((c) => [`${c.provider}.token`, c.token])),
    config: (gw, dir) => Object.fromEntries(CASES.map((c) => [c.provider, { upstream: gw.url(`/${c.provider}`), tokenFile: join(dir, `${c.provider}.token`), inject: c.inject }])),
  });
  const byProvider = new Map(CASES.map((c) => [c.provider, c]));
  gw.handle((req, res) => {
    const c = byProvider.get(req.url.split('/')[1] ?? '');
    if (!c) return json(res, 404, {});
    reflect(req, res, c.token, c.credential(req));
  });

  for (const c of CASES) {
    const mark = proxy.logs.length;
    const got = await fetchHeaders(`${proxy.base}/p/${c.provider}/items?per_page=2`, { authorization: 'Bearer agent-connectors-placeholder' });
    const seen = gw.requests.at(-1);
    t.equal(got.status, 200, `${c.provider}: answered`);
    t.ok(seen && c.credential(seen).length > 0, `${c.provider}: the SaaS received the injected credential (the attack was live)`);
    assertNoToken(t, got, c.token, c.basicPair, `${c.provider} (${c.inject.type})`);
    t.equal(got.headers['content-type'], 'application/json', `${c.provider}: content-type still passes`);
    t.equal(got.headers['x-ratelimit-remaining'], '41', `${c.provider}: x-ratelimit-remaining still passes`);
    for (const name of ['content-location', 'refresh', 'x-echo-authorization']) {
      t.equal(got.headers[name], undefined, `${c.provider}: ${name} is not on the allow-list`);
    }
    const warning = droppedWarning(proxy.logs, mark) ?? (await waitForLogAfter(proxy, mark, (l) => l.msg === 'dropped response headers holding the token'));
    t.ok(Array.isArray(warning.headers) && (warning.headers as string[]).includes('x-ratelimit-echo'), `${c.provider}: the drop is logged by header name`);
  }

  // A query-injected token repeated in a pagination Link is taken out of it, so the Link
  // still paginates (back through the proxy, which injects the token again).
  const qry = await fetchHeaders(`${proxy.base}/p/qry/items?per_page=2`);
  const links = [qry.headers.link].flat().filter((v): v is string => typeof v === 'string');
  t.ok(
    links.some((l) => l.includes(`<${proxy.base}/p/qry/items?per_page=2&page=2>; rel="next"`)),
    `the query provider's next Link survives without the token, through the proxy (got ${JSON.stringify(links).slice(0, 200)})`,
  );
});

t.test('cli-proxy: ordinary headers pass (content-type, a pagination Link without the token, rate limits, request ids)', async (t) => {
  const TOKEN = 'tok-reflect-plain-V2c4Rr7Ue9';
  knownSecrets.add(TOKEN);
  const { upstream: gw, proc: proxy } = await startRig<MockGateway>(t, 'cli-proxy', {
    tokens: { 'gh.token': TOKEN },
    config: (gw, dir) => ({ gh: { upstream: gw.url('/api'), tokenFile: join(dir, 'gh.token'), inject: { type: 'header', name: 'Authorization', value: 'token {token}' } } }),
  });
  const elsewhere = '<https://api.example.com/repos?page=3>; rel="next", <https://api.example.com/repos?page=9>; rel="last"';
  const ordinary: Record<string, string> = {
    'x-ratelimit-remaining': '4999',
    'x-ratelimit-reset': '1700000000',
    'x-github-request-id': 'ABCD:1234',
    'x-oauth-scopes': 'repo, read:org',
    etag: 'W/"abc"',
    'last-modified': 'Tue, 01 Jul 2025 00:00:00 GMT',
    'retry-after': '3',
    'x-amzn-requestid': 'req-1',
    'x-notion-request-id': 'req-2',
  };
  gw.handle((_req, res) =>
    json(res, 200, [], { ...ordinary, 'content-type': 'application/json; charset=utf-8', link: elsewhere, server: 'saas/1.0', 'x-powered-by': 'Express', refresh: '5' }),
  );
  const mark = proxy.logs.length;
  const got = await fetchHeaders(`${proxy.base}/p/gh/repos?per_page=2`);
  t.equal(got.status, 200);
  t.equal(got.headers['content-type'], 'application/json; charset=utf-8');
  t.equal(got.headers.link, elsewhere, 'a pagination Link elsewhere passes unchanged');
  for (const [name, value] of Object.entries(ordinary)) t.equal(got.headers[name], value, `${name} passes`);
  for (const name of ['server', 'x-powered-by', 'refresh']) t.equal(got.headers[name], undefined, `${name} dropped (not on the allow-list)`);
  // The access line comes after any drop warning of the same request.
  await waitForLogAfter(proxy, mark, (l) => l.msg === 'access');
  t.equal(droppedWarning(proxy.logs, mark), undefined, 'nothing held the token: no drop logged');
});

t.test('forwarder: a Gateway reflecting the bearer token in its headers hands no token back', async (t) => {
  const TOKEN = TOKENS.forwarder;
  const { gw, fwd, url } = await forwarderRig(t, { binding: 'bind_reflected_tok_01', token: TOKEN });
  gw.handle((req, res) => reflect(req, res, TOKEN, String(req.headers.authorization ?? '')));
  const mark = fwd.logs.length;
  const got = await fetchHeaders(url, { 'content-type': 'application/json', accept: 'application/json, text/event-stream' });
  t.equal(got.status, 200);
  t.equal(gw.requests.at(-1)?.headers.authorization, `Bearer ${TOKEN}`, 'the Gateway received the token (the attack was live)');
  assertNoToken(t, got, TOKEN, undefined, 'forwarder');
  t.equal(got.headers['content-type'], 'application/json', 'content-type still passes');
  const warning = await waitForLogAfter(fwd, mark, (l) => l.msg === 'dropped response headers holding the token');
  t.ok(Array.isArray(warning.headers) && (warning.headers as string[]).includes('mcp-session-id'), 'the drop is logged by header name');

  gw.handle((_req, res) => json(res, 200, { ok: true }, { 'mcp-session-id': 'sess-plain-1', 'cache-control': 'no-cache' }));
  const plain = await fetchHeaders(url, { 'content-type': 'application/json' });
  t.equal(plain.headers['mcp-session-id'], 'sess-plain-1', 'an ordinary session id still passes');
  t.equal(plain.headers['cache-control'], 'no-cache');
});

checkNoLeaks(t);
