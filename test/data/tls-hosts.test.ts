import t from 'tap';
import { parseCatalog } from '../../src/data/catalog.js';
import { parseDesiredState } from '../../src/data/desired-state.js';
import { hostEntryProblem, hostMatches, tlsProviderFor } from '../../src/data/tls-hosts.js';

const TOKEN_FILE = '/var/lib/agent-connectors/cli-proxy/gh.token';
const inject = { type: 'header', name: 'Authorization', value: 'token {token}' };

function tls(hosts: unknown, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { mode: 'tls', hosts, tokenFile: TOKEN_FILE, inject, ...extra };
}

t.test('host entries: DNS names and one-label wildcards pass; IPs, localhost, wide wildcards do not', async (t) => {
  for (const ok of ['api.github.com', 'uploads.github.com', '*.amazonaws.com', 'a-b.example.co.uk', 'xn--bcher-kva.example']) t.equal(hostEntryProblem(ok), undefined, ok);
  const bad: Array<[string, RegExp]> = [
    ['127.0.0.1', /IP address/],
    ['::1', /IP address/],
    ['[::1]', /IP address/],
    ['10.0.0.8', /IP address/],
    ['localhost', /localhost/],
    ['api.localhost', /localhost/],
    ['*.localhost', /localhost/],
    ['*.*.amazonaws.com', /wider than one label/],
    ['s3.*.amazonaws.com', /wider than one label/],
    ['*amazonaws.com', /wider than one label/],
    ['**.amazonaws.com', /wider than one label/],
    ['*', /wider than one label/],
    ['*.com', /top-level/],
    ['github', /fully qualified/],
    ['API.github.com', /lower-case/],
    ['api.github.com.', /lower-case/],
    ['-a.example.com', /lower-case/],
    ['127.1', /numeric/],
    ['0x7f.1', /numeric/],
    ['', /lower-case/],
  ];
  for (const [entry, why] of bad) t.match(hostEntryProblem(entry), why, JSON.stringify(entry));
});

t.test('matching: exact names, and a wildcard for exactly one label', async (t) => {
  t.ok(hostMatches('api.github.com', 'api.github.com'));
  t.notOk(hostMatches('api.github.com', 'x.api.github.com'));
  t.ok(hostMatches('*.amazonaws.com', 's3.amazonaws.com'));
  t.notOk(hostMatches('*.amazonaws.com', 'bucket.s3.amazonaws.com'), 'not two labels');
  t.notOk(hostMatches('*.amazonaws.com', 'amazonaws.com'), 'not the bare domain');
  t.notOk(hostMatches('*.amazonaws.com', 'evilamazonaws.com'), 'not a suffix without the dot');
  const catalog = { gh: { mode: 'tls', hosts: ['api.github.com'] }, aws: { mode: 'tls', hosts: ['*.amazonaws.com'] }, plain: { hosts: undefined } };
  t.equal(tlsProviderFor(catalog, 'API.GitHub.com.')?.name, 'gh', 'case and a trailing dot ignored');
  t.equal(tlsProviderFor(catalog, 's3.amazonaws.com')?.name, 'aws');
  t.equal(tlsProviderFor(catalog, 'example.org'), undefined, 'not a catalog host');
  t.equal(tlsProviderFor(catalog, 'github.com'), undefined);
});

t.test('a catalog breaking TLS mode\'s rules is rejected whole', async (t) => {
  const ok = parseCatalog(JSON.stringify({ gh: tls(['api.github.com']), aws: tls(['*.amazonaws.com']), notion: { upstream: 'https://api.notion.com', tokenFile: TOKEN_FILE, inject } }));
  t.ok(ok.ok, ok.ok ? 'valid' : ok.error);
  const cases: Array<[string, unknown, RegExp]> = [
    ['a host named by two providers', { a: tls(['api.github.com']), b: tls(['uploads.github.com', 'api.github.com']) }, /"api.github.com" is named by two providers/],
    ['an exact host under another provider\'s wildcard', { a: tls(['*.amazonaws.com']), b: tls(['s3.amazonaws.com']) }, /named by two providers/],
    ['a wildcard wider than one label', { a: tls(['*.*.amazonaws.com']) }, /wider than one label/],
    ['an IP address', { a: tls(['169.254.169.254']) }, /IP address/],
    ['localhost', { a: tls(['localhost']) }, /localhost/],
    ['a tls provider with an upstream', { a: tls(['api.github.com'], { upstream: 'https://api.github.com' }) }, /hosts, not upstream/],
    ['a tls provider without hosts', { a: { mode: 'tls', tokenFile: TOKEN_FILE, inject } }, /needs hosts/],
    ['hosts on a base-url provider', { a: { upstream: 'https://api.github.com', hosts: ['api.github.com'], tokenFile: TOKEN_FILE, inject } }, /hosts belong to mode "tls"/],
    ['a base-url provider without upstream', { a: { tokenFile: TOKEN_FILE, inject } }, /upstream is required/],
    ['an empty hosts list', { a: tls([]) }, /at least one host/],
    ['a placeholder with a space', { a: tls(['api.github.com'], { placeholder: 'a b' }) }, /placeholder/],
  ];
  for (const [what, catalog, why] of cases) {
    const r = parseCatalog(JSON.stringify(catalog));
    t.notOk(r.ok, `${what}: rejected`);
    if (!r.ok) t.match(r.error, why, what);
  }
});

t.test('the Gateway\'s desired state is held to the same rules (state_rejected)', async (t) => {
  const state = (providers: unknown): string => JSON.stringify({ version: 3, bindings: {}, providers });
  const good = parseDesiredState(state({ gh: { mode: 'tls', hosts: ['api.github.com'], inject, placeholder: 'ghp_x' } }));
  t.ok(good.ok, good.ok ? 'a tls provider applies' : good.error);
  for (const providers of [
    { a: { mode: 'tls', hosts: ['api.github.com'], inject }, b: { mode: 'tls', hosts: ['api.github.com'], inject } },
    { a: { mode: 'tls', hosts: ['*.*.example.com'], inject } },
    { a: { mode: 'tls', hosts: ['127.0.0.1'], inject } },
    { a: { mode: 'tls', hosts: ['localhost'], inject } },
  ]) {
    t.notOk(parseDesiredState(state(providers)).ok, JSON.stringify(providers));
  }
});
