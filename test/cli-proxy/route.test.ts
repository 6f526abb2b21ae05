import t from 'tap';
import { rewriteLinkHeader, rewriteLocation, routeCli, upstreamUrl } from '../../src/cli-proxy/route.js';

t.test('routeCli: health, providers with raw rest and query, everything else not found', async (t) => {
  t.same(routeCli('/healthz'), { kind: 'health' });
  t.same(routeCli('/healthz?x=1'), { kind: 'health' });
  t.same(routeCli('/p/notion/v1/search?q=a%20b&x'), { kind: 'provider', provider: 'notion', rest: '/v1/search', search: '?q=a%20b&x' });
  t.same(routeCli('/p/notion'), { kind: 'provider', provider: 'notion', rest: '', search: '' });
  t.same(routeCli('/p/notion/a%2Fb/..%2F'), { kind: 'provider', provider: 'notion', rest: '/a%2Fb/..%2F', search: '' }, 'rest kept raw, not decoded');
  for (const target of [undefined, '', '*', 'http://127.0.0.1/p/x', '/', '/p', '/p/', '/healthz/', '/q/notion/x']) {
    t.same(routeCli(target), { kind: 'not_found' }, `${String(target)}: not found`);
  }
});

t.test('routeCli: a provider segment outside the name pattern is an unknown provider', async (t) => {
  for (const target of ['/p/no%20space/x', '/p/a:b', `/p/${'x'.repeat(65)}`]) t.same(routeCli(target), { kind: 'unknown_provider' }, target);
});

t.test('upstreamUrl: base path kept, CLI path and query appended byte for byte', async (t) => {
  t.equal(upstreamUrl('https://api.example.com/v1', '/search', '?q=1').href, 'https://api.example.com/v1/search?q=1');
  t.equal(upstreamUrl('https://api.example.com/v1/', '/search', '').href, 'https://api.example.com/v1/search', 'trailing slash of the base');
  t.equal(upstreamUrl('https://api.example.com', '', '').href, 'https://api.example.com/');
  t.equal(upstreamUrl('https://api.example.com/v1', '', '?a').href, 'https://api.example.com/v1?a');
  t.equal(upstreamUrl('https://api.example.com/v1', '/a%2Fb', '?x=%7e').href, 'https://api.example.com/v1/a%2Fb?x=%7e', 'encodings not normalised');
});

t.test('upstreamUrl: dot segments resolve, so the handler must check the result stays under the base', async (t) => {
  // The handler refuses these (404); routing alone would leave the base path.
  t.equal(upstreamUrl('https://api.example.com/v1', '/../admin', '').pathname, '/admin');
  t.equal(upstreamUrl('https://api.example.com/v1', '/%2e%2e/admin', '').pathname, '/admin');
});

t.test('rewriteLocation: a redirect into the upstream base goes through the proxy again', async (t) => {
  const req = new URL('https://api.example.com/v1/items?page=1');
  const base = 'https://api.example.com/v1';
  const proxy = 'http://127.0.0.1:4000/p/demo';
  t.equal(rewriteLocation('/v1/items?page=2#x', req, base, proxy), `${proxy}/items?page=2#x`, 'relative');
  t.equal(rewriteLocation('https://api.example.com/v1', req, base, proxy), proxy, 'the base itself');
  t.equal(rewriteLocation('next', req, base, proxy), `${proxy}/next`, 'relative to the request');
  for (const other of ['https://api.example.com/v1-admin/x', 'https://api.example.com/other', 'http://api.example.com/v1/x', 'https://evil.example/v1/x']) {
    t.equal(rewriteLocation(other, req, base, proxy), other, `${other}: passes unchanged`);
  }
  t.equal(rewriteLocation('http://[bad', req, base, proxy), 'http://[bad', 'unparseable: unchanged');
});

t.test('rewriteLinkHeader: every URI reference through the rewrite, parameters byte for byte', async (t) => {
  const value = '<https://api.example.com/v1/items?page=2>; rel="next", <https://other.example/x?page=9>; rel="last"; title="a, b"';
  const out = rewriteLinkHeader(value, (uri) => rewriteLocation(uri, new URL('https://api.example.com/v1/items'), 'https://api.example.com/v1', 'http://127.0.0.1:14324/p/api'));
  t.equal(out, '<http://127.0.0.1:14324/p/api/items?page=2>; rel="next", <https://other.example/x?page=9>; rel="last"; title="a, b"');
  t.equal(rewriteLinkHeader('no uri here', () => 'x'), 'no uri here');
});
