import t from 'tap';
import type { Inject } from '../../src/data/catalog.js';
import { fill, injectToken, strippedHeaders, withoutQueryParam, withQueryParam } from '../../src/cli-proxy/inject.js';
import type { HeaderRecord } from '../../src/http/headers.js';

const TOKEN = 'tok-unit-inject-Z9';

function injected(inject: Inject, headers: HeaderRecord = {}, url = 'https://api.example.com/v1/x?a=1'): { headers: HeaderRecord; url: URL } {
  const u = new URL(url);
  injectToken(inject, TOKEN, headers, u);
  return { headers, url: u };
}

t.test('fill replaces every {token}, and a replacement-pattern token stays literal', async (t) => {
  t.equal(fill('Key {token}', TOKEN), `Key ${TOKEN}`);
  t.equal(fill('{token}:{token}', 'a'), 'a:a');
  t.equal(fill('no placeholder', TOKEN), 'no placeholder');
  t.equal(fill('Bearer {token}', '$& $1 $$'), 'Bearer $& $1 $$', 'no $-pattern expansion');
});

t.test('header injection: the configured header (lower-cased) carries the filled template', async (t) => {
  const { headers, url } = injected({ type: 'header', name: 'X-Api-Key', value: 'Key {token}' }, { accept: 'application/json' });
  t.same(headers, { accept: 'application/json', 'x-api-key': `Key ${TOKEN}` });
  t.equal(url.search, '?a=1', 'the URL is untouched');
});

t.test('header injection replaces an agent value of the same header instead of adding to it', async (t) => {
  const { headers } = injected({ type: 'header', name: 'Authorization', value: 'Bearer {token}' }, { authorization: ['Bearer agent', 'Basic x'] });
  t.same(headers.authorization, `Bearer ${TOKEN}`);
});

t.test('basic injection: base64 of username:password with {token} filled in either', async (t) => {
  const both = injected({ type: 'basic', username: 'user-{token}', password: 'p-{token}' }).headers.authorization;
  t.equal(both, `Basic ${Buffer.from(`user-${TOKEN}:p-${TOKEN}`).toString('base64')}`);
  const pwOnly = injected({ type: 'basic', username: '', password: '{token}' }).headers.authorization;
  t.equal(pwOnly, `Basic ${Buffer.from(`:${TOKEN}`).toString('base64')}`);
});

t.test('query injection: the parameter is set once, every other parameter byte for byte', async (t) => {
  const { headers, url } = injected({ type: 'query', name: 'key' }, {}, 'https://api.example.com/v1/x?b=%7E+x&key=agent&a=1&key=again');
  t.same(headers, {}, 'no header added');
  t.equal(url.search, `?b=%7E+x&a=1&key=${TOKEN}`);
});

t.test('withQueryParam: empty queries, an encoded spelling of the name, a token needing encoding', async (t) => {
  t.equal(withQueryParam('', 'key', 'v'), '?key=v');
  t.equal(withQueryParam('?', 'key', 'v'), '?key=v');
  t.equal(withQueryParam('?k%65y=agent&x=1', 'key', 'v'), '?x=1&key=v', 'a percent-encoded spelling of the name is dropped too');
  t.equal(withQueryParam('?a+b=1', 'a b', 'v'), '?a%20b=v', '+ decodes to a space when matching');
  t.equal(withQueryParam('?%zz=1', 'key', 'v'), '?%zz=1&key=v', 'an undecodable pair is kept, not thrown on');
  t.equal(withQueryParam('', 'key', 'a&b=c d'), '?key=a%26b%3Dc%20d', 'the value cannot add parameters');
});

t.test('withoutQueryParam: removes the parameter from a Location, keeping path, others and fragment', async (t) => {
  t.equal(withoutQueryParam('/next?key=tok&page=2#frag', 'key'), '/next?page=2#frag');
  t.equal(withoutQueryParam('https://h/x?key=tok', 'key'), 'https://h/x');
  t.equal(withoutQueryParam('https://h/x', 'key'), 'https://h/x');
  t.equal(withoutQueryParam('/x?page=1#a?key=tok', 'key'), '/x?page=1#a?key=tok', 'a ? inside the fragment is not the query');
});

t.test('strippedHeaders: agent credentials, host and forwarding headers, plus the injection header', async (t) => {
  const header = strippedHeaders({ type: 'header', name: 'X-Api-Key', value: '{token}' });
  for (const n of ['authorization', 'cookie', 'proxy-authorization', 'host', 'origin', 'referer', 'forwarded', 'x-api-key']) {
    t.ok(header.has(n), `${n} stripped`);
  }
  t.notOk(header.has('X-Api-Key'), 'names are lower-case');
  const query = strippedHeaders({ type: 'query', name: 'key' });
  t.notOk(query.has('x-api-key'));
  t.ok(query.has('authorization'), 'an agent Authorization never passes, whatever the injection');
  t.ok(query.has('expect'), 'Expect: 100-continue is answered by the proxy, never sent on (undici refuses it)');
});
