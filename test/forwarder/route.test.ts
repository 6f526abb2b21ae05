import t from 'tap';
import { HEALTH_METHODS, MCP_METHODS, mcpMethodOf, route } from '../../src/forwarder/route.js';

const ID = 'bind_route_0001';

t.test('method lists', async (t) => {
  t.strictSame([...MCP_METHODS].sort(), ['DELETE', 'GET', 'POST']);
  t.ok((HEALTH_METHODS as readonly string[]).includes('GET'));
});

t.test('health', async (t) => {
  t.strictSame(route('/healthz'), { kind: 'health' });
  t.strictSame(route('/healthz?verbose=1'), { kind: 'health' });
  t.strictSame(route('/healthz/'), { kind: 'not_found' });
  t.strictSame(route('/HEALTHZ'), { kind: 'not_found' });
  t.strictSame(route('/healthz/x'), { kind: 'not_found' });
});

t.test('mcp path with a well-formed binding id', async (t) => {
  t.strictSame(route(`/i/${ID}/mcp`), { kind: 'mcp', bindingId: ID });
  t.strictSame(route(`/i/${ID}/mcp?session=1&x=/i/other/mcp`), { kind: 'mcp', bindingId: ID }, 'query ignored');
  t.strictSame(route('/i/abcdefgh/mcp'), { kind: 'mcp', bindingId: 'abcdefgh' }, '8 chars');
  const long = 'x'.repeat(128);
  t.strictSame(route(`/i/${long}/mcp`), { kind: 'mcp', bindingId: long }, '128 chars');
  t.strictSame(route('/i/A-b_C-d_E/mcp'), { kind: 'mcp', bindingId: 'A-b_C-d_E' });
});

t.test('mcp path with a malformed binding id → unknown_binding', async (t) => {
  for (const id of ['abcdefg', 'x'.repeat(129), 'abc.defgh', 'abcd%2Fefgh', 'abcd%20efgh', '..', '.', 'abcd efgh', 'abcdéfgh', 'abcd:efgh']) {
    t.strictSame(route(`/i/${id}/mcp`), { kind: 'unknown_binding' }, JSON.stringify(id));
  }
});

t.test('everything else → not_found', async (t) => {
  for (const target of [
    undefined,
    '',
    '*',
    'i/abcdefgh/mcp',
    'http://127.0.0.1:14323/i/abcdefgh/mcp',
    '/',
    '/i',
    '/i/',
    `/i/${ID}`,
    `/i/${ID}/`,
    `/i/${ID}/mcp/`,
    `/i/${ID}/mcp/extra`,
    `/i/${ID}/MCP`,
    `/I/${ID}/mcp`,
    `/i//mcp`,
    `//i/${ID}/mcp`,
    `/i/${ID}//mcp`,
    `/i/a/${ID}/mcp`,
    `/x/i/${ID}/mcp`,
    `/i/${ID}/sse`,
    `/i/${ID}/mcp.json`,
    '/.well-known/oauth-authorization-server',
    '/.well-known/oauth-protected-resource',
    `/.well-known/oauth-protected-resource/i/${ID}/mcp`,
    '/register',
    '/authorize',
    '/token',
    '/mcp',
    '/favicon.ico',
  ]) {
    t.strictSame(route(target), { kind: 'not_found' }, JSON.stringify(target));
  }
});

t.test('mcpMethodOf: the mcp-method header wins', async (t) => {
  const body = Buffer.from('{"jsonrpc":"2.0","id":1,"method":"tools/list"}');
  t.equal(mcpMethodOf('tools/call', body), 'tools/call');
  t.equal(mcpMethodOf('tools/call', Buffer.alloc(0)), 'tools/call');
  t.equal(mcpMethodOf('m'.repeat(200), body), 'm'.repeat(64), 'header capped at 64 chars');
  t.equal(mcpMethodOf('', body), 'tools/list', 'an empty header falls back to the body');
  t.equal(mcpMethodOf(undefined, body), 'tools/list');
});

t.test('mcpMethodOf: from the JSON-RPC body', async (t) => {
  const m = (s: string): string | undefined => mcpMethodOf(undefined, Buffer.from(s));
  t.equal(m('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'), 'initialize');
  t.equal(m('{"jsonrpc":"2.0","method":"notifications/initialized"}'), 'notifications/initialized');
  t.equal(m(`{"method":"${'z'.repeat(100)}"}`), 'z'.repeat(64), 'capped at 64 chars');
  t.equal(m('[{"jsonrpc":"2.0","id":1,"method":"tools/call"},{"jsonrpc":"2.0","id":2,"method":"tools/list"}]'), 'batch:tools/call');
  t.equal(m('[{"jsonrpc":"2.0","id":1,"method":"ping"}]'), 'ping', 'a one-element batch is its method');
  t.equal(m('{"jsonrpc":"2.0","id":1,"result":{}}'), 'response');
  t.equal(m('[{"jsonrpc":"2.0","id":1,"result":{}}]'), 'response');
});

t.test('mcpMethodOf: the head-of-message shortcut agrees with parsing', async (t) => {
  const m = (s: string): string | undefined => mcpMethodOf(undefined, Buffer.from(s));
  t.equal(m('{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{}}'), 'tools/call', 'string id');
  t.equal(m(' { "id" : -7 , "jsonrpc" : "2.0" , "method" : "ping" }'), 'ping', 'whitespace, keys in another order');
  t.equal(m('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"method":"inner"}}'), 'tools/call', 'a nested "method" is not the method');
  t.equal(m('{"jsonrpc":"2.0","method":"first","method":"second"}'), 'second', 'a repeated key: the last one, as JSON.parse');
  t.equal(m('{"jsonrpc":"2.0","method":"a\\"b"}'), 'a"b', 'an escaped quote in the name');
  t.equal(m('{"jsonrpc":"2.0","method":"caf\\u00e9"}'), 'café', 'a unicode escape');
  t.equal(m('{"jsonrpc":"2.0","method":"café"}'), 'café', 'UTF-8 in the name');
  t.equal(m('{"id":1,"params":{"method":"x"}}'), undefined, 'only a nested method: none');
  t.equal(m('{"params":{},"method":"late"}'), 'late', 'method after params (parsed)');
  t.equal(m('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'), 'tools/call', 'a truncated message is logged with the method its head names');
});

t.test('mcpMethodOf: nothing to say', async (t) => {
  const m = (s: string | Buffer): string | undefined => mcpMethodOf(undefined, typeof s === 'string' ? Buffer.from(s) : s);
  for (const s of ['', 'not json', '{', 'null', '42', '"tools/list"', '[]', '{}', '{"method":42}', '{"method":null}', '[null]', '{"jsonrpc":"2.0","id":1,"error":{"code":-1}}']) {
    t.equal(m(s), undefined, JSON.stringify(s));
  }
  const huge = Buffer.from(`{"method":"tools/list","pad":"${'x'.repeat(70 * 1024)}"}`);
  t.equal(m(huge), undefined, 'bodies over 64 KiB are not parsed');
  t.equal(m(Buffer.from([0xff, 0xfe, 0x00])), undefined, 'binary garbage');
});

t.test('a route repeated or alternated is answered the same', async (t) => {
  const mcp = `/i/${ID}/mcp`;
  for (const target of [mcp, mcp, '/healthz', mcp, '/nope', '/nope', mcp, `${mcp}?x=1`, undefined, mcp]) {
    const want = target === undefined || target === '/nope' ? { kind: 'not_found' } : target === '/healthz' ? { kind: 'health' } : { kind: 'mcp', bindingId: ID };
    t.strictSame(route(target), want, String(target));
  }
});
