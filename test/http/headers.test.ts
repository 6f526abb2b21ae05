import t from 'tap';
import {
  agentToUpstreamPolicy,
  cliUpstreamToAgentPolicy,
  filterResponseRecord,
  dropHeaderRecord,
  dropRawHeaders,
  filterHeaderRecord,
  filterRawHeaders,
  filterRawHeaderList,
  upstreamToAgentPolicy,
  type HeaderRecord,
} from '../../src/http/headers.js';

/** Turns a list of [name, value] pairs into Node's flat rawHeaders form. */
function raw(pairs: Array<[string, string]>): string[] {
  return pairs.flat();
}

const AGENT_KEPT = [
  'accept',
  'content-type',
  'mcp-session-id',
  'mcp-protocol-version',
  'last-event-id',
  'mcp-method',
  'mcp-name',
  'user-agent',
];

const AGENT_DROPPED = [
  'authorization',
  'cookie',
  'origin',
  'referer',
  'forwarded',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
  'proxy-authorization',
  'proxy-connection',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'host',
  'content-length',
  'x-request-id',
  'x-api-key',
  'mcp-paramx',
  'mcp-param',
  'x-mcp-param-foo',
];

const UPSTREAM_KEPT = [
  'content-type',
  'mcp-session-id',
  'mcp-protocol-version',
  'cache-control',
  'retry-after',
  'content-encoding',
  'content-length',
];

const UPSTREAM_DROPPED = [
  'www-authenticate',
  'set-cookie',
  'server',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authenticate',
  'authorization',
  'x-powered-by',
  'mcp-param-foo',
  'mcp-method',
  'location',
  'access-control-allow-origin',
];

t.test('agent → upstream: filterRawHeaders keeps exactly the whitelist', async (t) => {
  const pairs: Array<[string, string]> = [
    ...AGENT_KEPT.map((n): [string, string] => [n, `v-${n}`]),
    ...AGENT_DROPPED.map((n): [string, string] => [n, `v-${n}`]),
  ];
  const out = filterRawHeaders(raw(pairs), agentToUpstreamPolicy);
  const expected: HeaderRecord = Object.fromEntries(AGENT_KEPT.map((n) => [n, `v-${n}`]));
  t.same(out, expected);
  t.strictSame(Object.keys(out).sort(), [...AGENT_KEPT].sort());
  for (const n of AGENT_DROPPED) t.notOk(n in out, `${n} dropped`);
});

t.test('agent → upstream: names match case-insensitively, output is lower-cased', async (t) => {
  const out = filterRawHeaders(
    raw([
      ['Content-Type', 'application/json'],
      ['ACCEPT', 'text/event-stream'],
      ['Mcp-Session-Id', 'sess-1'],
      ['MCP-Protocol-Version', '2025-06-18'],
      ['Authorization', 'Bearer agent-own'],
      ['COOKIE', 'a=b'],
      ['X-Forwarded-For', '10.0.0.1'],
      ['Mcp-Param-Region', 'eu'],
    ]),
    agentToUpstreamPolicy,
  );
  t.strictSame(out, {
    'content-type': 'application/json',
    accept: 'text/event-stream',
    'mcp-session-id': 'sess-1',
    'mcp-protocol-version': '2025-06-18',
    'mcp-param-region': 'eu',
  });
});

t.test('agent → upstream: mcp-param-* is a prefix match', async (t) => {
  const out = filterRawHeaders(
    raw([
      ['mcp-param-a', '1'],
      ['MCP-PARAM-Long-Name-With-Dashes', '2'],
      ['mcp-params', 'no'],
      ['xmcp-param-a', 'no'],
    ]),
    agentToUpstreamPolicy,
  );
  t.strictSame(out, { 'mcp-param-a': '1', 'mcp-param-long-name-with-dashes': '2' });
});

t.test('repeated headers are kept as arrays in order, never merged', async (t) => {
  const out = filterRawHeaders(
    raw([
      ['Accept', 'application/json'],
      ['mcp-param-x', 'a'],
      ['accept', 'text/event-stream'],
      ['ACCEPT', '*/*'],
      ['mcp-param-x', 'b'],
      ['cookie', 'one'],
      ['cookie', 'two'],
    ]),
    agentToUpstreamPolicy,
  );
  t.strictSame(out, { accept: ['application/json', 'text/event-stream', '*/*'], 'mcp-param-x': ['a', 'b'] });
});

t.test('values pass unchanged (no trimming or joining)', async (t) => {
  const out = filterRawHeaders(raw([['user-agent', ' spaced , value ']]), agentToUpstreamPolicy);
  t.equal(out['user-agent'], ' spaced , value ');
});

t.test('a trailing name without a value is ignored', async (t) => {
  const out = filterRawHeaders(['accept', 'a', 'content-type'], agentToUpstreamPolicy);
  t.strictSame(out, { accept: 'a' });
});

t.test('upstream → agent: filterRawHeaders keeps exactly the whitelist', async (t) => {
  const pairs: Array<[string, string]> = [
    ...UPSTREAM_DROPPED.map((n): [string, string] => [n, `v-${n}`]),
    ...UPSTREAM_KEPT.map((n): [string, string] => [n.toUpperCase(), `v-${n}`]),
  ];
  const out = filterRawHeaders(raw(pairs), upstreamToAgentPolicy);
  t.strictSame(out, Object.fromEntries(UPSTREAM_KEPT.map((n) => [n, `v-${n}`])));
  for (const n of UPSTREAM_DROPPED) t.notOk(n in out, `${n} dropped`);
});

t.test('upstream → agent: www-authenticate, set-cookie, server dropped whatever their case', async (t) => {
  const out = filterRawHeaders(
    raw([
      ['WWW-Authenticate', 'Bearer resource_metadata="https://gw/.well-known/oauth-protected-resource"'],
      ['Set-Cookie', 'sid=1'],
      ['Set-Cookie', 'sid=2'],
      ['Server', 'nginx'],
      ['Content-Type', 'text/event-stream'],
    ]),
    upstreamToAgentPolicy,
  );
  t.strictSame(out, { 'content-type': 'text/event-stream' });
});

t.test('filterHeaderRecord: agent policy', async (t) => {
  const input: Record<string, string | string[] | undefined> = {};
  for (const n of AGENT_KEPT) input[n] = `v-${n}`;
  for (const n of AGENT_DROPPED) input[n] = `v-${n}`;
  input['Mcp-Param-Zone'] = ['z1', 'z2'];
  input['mcp-name'] = undefined;
  input['X-Forwarded-For'] = '1.2.3.4';
  const out = filterHeaderRecord(input, agentToUpstreamPolicy);
  const expected: HeaderRecord = Object.fromEntries(AGENT_KEPT.filter((n) => n !== 'mcp-name').map((n) => [n, `v-${n}`]));
  expected['mcp-param-zone'] = ['z1', 'z2'];
  t.strictSame(out, expected);
});

t.test('filterHeaderRecord: upstream policy (undici-style record)', async (t) => {
  const out = filterHeaderRecord(
    {
      'Content-Type': 'application/json',
      'content-length': '42',
      'mcp-session-id': 's',
      'www-authenticate': 'Bearer realm="x"',
      'set-cookie': ['a=1', 'b=2'],
      server: 'gw',
      connection: 'keep-alive',
      'keep-alive': 'timeout=5',
      'transfer-encoding': 'chunked',
      'Retry-After': '3',
      'Cache-Control': 'no-cache',
      'content-encoding': 'gzip',
      'mcp-protocol-version': '2025-06-18',
    },
    upstreamToAgentPolicy,
  );
  t.strictSame(out, {
    'content-type': 'application/json',
    'content-length': '42',
    'mcp-session-id': 's',
    'retry-after': '3',
    'cache-control': 'no-cache',
    'content-encoding': 'gzip',
    'mcp-protocol-version': '2025-06-18',
  });
});

t.test('filterHeaderRecord drops every non-whitelisted header for both policies', async (t) => {
  const dropAgent = Object.fromEntries(AGENT_DROPPED.map((n) => [n, 'x']));
  t.strictSame(filterHeaderRecord(dropAgent, agentToUpstreamPolicy), {});
  const dropUp = Object.fromEntries(UPSTREAM_DROPPED.map((n) => [n, 'x']));
  t.strictSame(filterHeaderRecord(dropUp, upstreamToAgentPolicy), {});
  t.strictSame(filterRawHeaders([], agentToUpstreamPolicy), {});
});

t.test('cli-proxy: dropRawHeaders drops hop-by-hop, Connection-named, x-forwarded-* and the drop set; keeps the rest', async (t) => {
  const out = dropRawHeaders(
    raw([
      ['Host', '127.0.0.1:4000'],
      ['Connection', 'keep-alive, X-Secret-Hop'],
      ['X-Secret-Hop', 'named by Connection'],
      ['Keep-Alive', 'timeout=5'],
      ['Transfer-Encoding', 'chunked'],
      ['Proxy-Authorization', 'Basic eDp5'],
      ['X-Forwarded-For', '10.0.0.1'],
      ['Authorization', 'Bearer agent'],
      ['Notion-Version', '2022-06-28'],
      ['X-Custom', 'a'],
      ['x-custom', 'b'],
    ]),
    new Set(['host', 'authorization']),
  );
  t.same(out, { 'notion-version': '2022-06-28', 'x-custom': ['a', 'b'] });
});

t.test('cli-proxy: dropHeaderRecord drops hop-by-hop, Connection-named and the drop set from a response', async (t) => {
  const out = dropHeaderRecord(
    {
      connection: 'close, x-hop',
      'x-hop': '1',
      'transfer-encoding': 'chunked',
      'set-cookie': ['a=1', 'b=2'],
      'content-type': 'application/json',
      location: '/next',
      'x-absent': undefined,
    },
    new Set(['set-cookie']),
  );
  t.same(out, { 'content-type': 'application/json', location: '/next' });
});

t.test('cli-proxy: filterResponseRecord keeps what CLIs read, drops the rest and what Connection names', async (t) => {
  const kept: Record<string, string> = {
    'content-type': 'application/json',
    'content-length': '2',
    'content-disposition': 'attachment; filename="a.tgz"',
    etag: 'W/"1"',
    'last-modified': 'Tue, 01 Jul 2025 00:00:00 GMT',
    link: '<https://x/?page=2>; rel="next"',
    location: '/next',
    'retry-after': '3',
    'www-authenticate': 'Bearer',
    'x-ratelimit-remaining': '41',
    'ratelimit-policy': '100;w=60',
    'x-rate-limit-reset': '1',
    'x-github-request-id': 'A:B',
    'x-oauth-scopes': 'repo',
    'x-amz-request-id': 'r',
    'x-amzn-errortype': 'ThrottlingException',
    'x-notion-request-id': 'n',
    'x-total-pages': '9',
  };
  const dropped = ['set-cookie', 'content-location', 'refresh', 'server', 'x-powered-by', 'via', 'x-echo', 'transfer-encoding', 'keep-alive'];
  const input: Record<string, string | string[] | undefined> = { ...kept, connection: 'keep-alive, etag', 'x-absent': undefined };
  for (const n of dropped) input[n] = 'v';
  const out = filterResponseRecord(input, cliUpstreamToAgentPolicy);
  const expected: HeaderRecord = { ...kept };
  delete expected.etag; // named by the upstream's Connection: hop-by-hop for this answer
  t.same(out, expected);
});

t.test('filterRawHeaderList: the allow-list into a flat list, names lower-cased, repeats where they were sent', async (t) => {
  const raw = ['Accept', 'application/json', 'Cookie', 'c=1', 'MCP-Param-Region', 'eu', 'X-Forwarded-For', '1.2.3.4', 'accept', 'text/event-stream', 'Authorization', 'Bearer agent', 'Mcp-Session-Id', 's1', 'X-Request-Id', 'agent-id'];
  t.strictSame(filterRawHeaderList(raw, agentToUpstreamPolicy), ['accept', 'application/json', 'mcp-param-region', 'eu', 'accept', 'text/event-stream', 'mcp-session-id', 's1']);
  t.strictSame(filterRawHeaderList(['Accept'], agentToUpstreamPolicy), [], 'a name without a value is dropped');
  // The same headers as the record filter, bar the grouping of repeats.
  const record = filterRawHeaders(raw, agentToUpstreamPolicy);
  const list = filterRawHeaderList(raw, agentToUpstreamPolicy);
  const grouped: Record<string, string[]> = {};
  for (let i = 0; i < list.length; i += 2) (grouped[list[i] as string] ??= []).push(list[i + 1] as string);
  t.strictSame(
    Object.fromEntries(Object.entries(grouped).map(([k, v]) => [k, v.length === 1 ? v[0] : v])),
    record,
  );
});
