import t from 'tap';
import { parseCatalog, type Catalog } from '../../src/data/catalog.js';
import type { TapTest } from '../support/tap.js';

const TOKEN_FILE = '/var/lib/agent-connectors/cli-proxy/notion.token';

function provider(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { upstream: 'https://api.notion.com/v1', tokenFile: TOKEN_FILE, inject: { type: 'header', name: 'X-Api-Key', value: 'Key {token}' }, ...extra };
}

/**
 * Every parse in this file runs twice: whole, and as the cli-proxy's reload does, given a
 * catalog in force that shares names (and values) with the cases; both must agree exactly.
 */
const inForce = parseCatalog(JSON.stringify({ a: provider(), b: provider({ commands: [{ name: 'other' }] }), c: provider(), notion: provider({ commands: [{ name: 'ntn' }] }) }));
let compared = 0;
function parse(value: unknown): ReturnType<typeof parseCatalog> {
  if (!inForce.ok) throw new Error(inForce.error);
  const whole = parseCatalog(JSON.stringify(value));
  const reload = parseCatalog(JSON.stringify(value), inForce.value);
  if (JSON.stringify(reload) !== JSON.stringify(whole)) throw new Error(`a reload parse differs from the whole parse: ${JSON.stringify(reload)} vs ${JSON.stringify(whole)}`);
  compared += 1;
  return whole;
}

function rejected(t: TapTest, value: unknown, what: string): void {
  const r = parse(value);
  t.notOk(r.ok, `${what}: rejected`);
}

t.test('a full catalog parses, with defaults filled in', async (t) => {
  const r = parse({
    notion: provider({ commands: [{ name: 'ntn', env: { NOTION_API_BASE: '{baseUrl}', NOTION_TOKEN: '{placeholder}' } }] }),
    grafana: { upstream: 'http://127.0.0.1:3000/api', tokenFile: TOKEN_FILE, inject: { type: 'basic', username: 'admin' } },
    maps: { upstream: 'https://maps.example.com', tokenFile: TOKEN_FILE, inject: { type: 'query', name: 'key' }, commands: [{ name: 'maps' }] },
  });
  if (!r.ok) return t.fail(r.error);
  const c: Catalog = r.value;
  t.same(c.notion?.commands, [{ name: 'ntn', env: { NOTION_API_BASE: '{baseUrl}', NOTION_TOKEN: '{placeholder}' } }]);
  t.same(c.grafana?.inject, { type: 'basic', username: 'admin', password: '{token}' }, 'basic password defaults to the token');
  t.same(c.grafana?.commands, [], 'commands default to none');
  t.same(c.maps?.commands, [{ name: 'maps', env: {} }], 'env defaults to empty');
  t.same(parse({}), { ok: true, value: {} }, 'an empty catalog is valid');
});

t.test('a command name declared by two providers is refused, naming it', async (t) => {
  const r = parse({ a: provider({ commands: [{ name: 'tool' }] }), b: provider({ commands: [{ name: 'other' }, { name: 'tool' }] }) });
  t.same(r, { ok: false, error: 'schema: command "tool" is declared by two providers' });
});

t.test('reserved (connection) headers are never an injection target, whatever their case', async (t) => {
  for (const name of ['Host', 'connection', 'Content-Length', 'transfer-encoding', 'TE', 'trailer', 'upgrade', 'keep-alive']) {
    rejected(t, { p: provider({ inject: { type: 'header', name, value: '{token}' } }) }, `header ${name}`);
  }
  t.ok(parse({ p: provider({ inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } }) }).ok, 'Authorization is a valid target');
});

t.test('path-like names are refused: provider, command, env', async (t) => {
  for (const name of ['../etc', 'a/b', '..\\x', '', 'a b']) {
    rejected(t, { [name]: provider() }, `provider ${JSON.stringify(name)}`);
    rejected(t, { p: provider({ commands: [{ name }] }) }, `command ${JSON.stringify(name)}`);
  }
  rejected(t, { p: provider({ commands: [{ name: 'x', env: { '../X': 'v' } }] }) }, 'env name with a path');
  rejected(t, { p: provider({ commands: [{ name: 'x', env: { '1X': 'v' } }] }) }, 'env name starting with a digit');
});

t.test('"." and ".." are refused as provider or command names', async (t) => {
  // A shim named ".." would be written to join(shimDir, ".."); a provider ".." makes /p/../ a route.
  for (const name of ['.', '..']) {
    rejected(t, { [name]: provider() }, `provider ${name}`);
    rejected(t, { p: provider({ commands: [{ name }] }) }, `command ${name}`);
  }
});

t.test('upstreams: https anywhere, http only to loopback, no credentials, no other scheme', async (t) => {
  for (const upstream of ['https://api.example.com', 'http://127.0.0.1:8080/x', 'http://localhost/x', 'http://[::1]:9/x']) {
    t.ok(parse({ p: provider({ upstream }) }).ok, `${upstream}: accepted`);
  }
  for (const upstream of ['http://api.example.com/v1', 'http://10.0.0.1/x', 'ftp://127.0.0.1/x', 'https://user:pw@api.example.com', 'not a url', '/relative']) {
    rejected(t, { p: provider({ upstream }) }, upstream);
  }
});

t.test('inject templates must carry {token}; token files must be absolute; unknown fields refused', async (t) => {
  rejected(t, { p: provider({ inject: { type: 'header', name: 'X-Key', value: 'static' } }) }, 'header template without {token}');
  rejected(t, { p: provider({ inject: { type: 'basic', username: 'u', password: 'p' } }) }, 'basic without {token}');
  rejected(t, { p: provider({ inject: { type: 'query', name: 'a&b' } }) }, 'query name with &');
  rejected(t, { p: provider({ inject: { type: 'cookie', name: 'x' } }) }, 'unknown inject type');
  rejected(t, { p: provider({ tokenFile: 'notion.token' }) }, 'relative token file');
  rejected(t, { p: provider({ extra: 1 }) }, 'unknown provider field');
  rejected(t, { p: provider({ inject: { type: 'query', name: 'k', value: '{token}' } }) }, 'unknown inject field');
});

t.test('errors never quote the file', async (t) => {
  const canary = 'canaryCATALOG4417';
  for (const text of [`{"p": {"upstream": "${canary}`, JSON.stringify({ p: provider({ upstream: `http://evil.example/${canary}` }) }), JSON.stringify({ [`bad name ${canary}`]: provider() })]) {
    const r = parseCatalog(text);
    t.notOk(r.ok);
    if (!r.ok) t.notMatch(r.error, canary);
  }
  t.same(parseCatalog('{'), { ok: false, error: 'invalid JSON' });
});

t.test('commands[].args: up to 16, each up to 1024 characters on one line, else the catalog is rejected whole', async (t) => {
  const ok = parse({ stripe: provider({ commands: [{ name: 'stripe', args: ['--api-base', '{baseUrl}', '--api-key', '{placeholder}'] }] }) });
  if (!ok.ok) return t.fail(ok.error);
  t.same(ok.value.stripe?.commands[0]?.args, ['--api-base', '{baseUrl}', '--api-key', '{placeholder}']);
  const bad: Array<[string, unknown]> = [
    ['a line feed', ['a\nb']],
    ['a carriage return', ['a\rb']],
    ['a NUL', ['a\u0000b']],
    ['17 args', Array.from({ length: 17 }, () => 'x')],
    ['an arg of 1025 characters', ['x'.repeat(1025)]],
    ['a number', [1]],
    ['not a list', '--flag'],
  ];
  for (const [what, args] of bad) {
    rejected(t, { good: provider(), stripe: provider({ commands: [{ name: 'stripe', args }] }) }, what);
  }
  t.ok(parse({ stripe: provider({ commands: [{ name: 'stripe', args: Array.from({ length: 16 }, () => 'x'.repeat(1024)) }] }) }).ok, '16 args of 1024 characters: the bound itself passes');
});

t.test('placeholder: printable ASCII, no space, 1-256 characters', async (t) => {
  t.ok(parse({ a: provider({ placeholder: 'ghp_agentconnectors000000000000000000000' }) }).ok);
  for (const [what, placeholder] of [
    ['a line feed', 'a\nb'],
    ['a NUL', 'a\u0000b'],
    ['a space', 'a b'],
    ['non-ASCII', 'pläceholder'],
    ['empty', ''],
    ['257 characters', 'x'.repeat(257)],
  ] as const) {
    rejected(t, { a: provider({ placeholder }) }, what);
  }
});

t.test('provider ports: in 18300-18399, one provider each, base-url providers only', async (t) => {
  const ok = parse({ a: provider({ port: 18300 }), b: provider({ port: 18399 }), c: provider() });
  t.ok(ok.ok, 'the range ends pass');
  for (const port of [18299, 18400, 0, 80, 18300.5, '18301']) rejected(t, { a: provider({ port }) }, `port ${String(port)}`);
  t.same(parse({ a: provider({ port: 18301 }), b: provider({ port: 18301 }) }), { ok: false, error: 'schema: port 18301 is named by two providers (a, b)' });
  const tls = parse({ gh: { mode: 'tls', hosts: ['api.github.com'], tokenFile: TOKEN_FILE, inject: { type: 'header', name: 'Authorization', value: 'token {token}' }, port: 18302 } });
  t.notOk(tls.ok, 'a tls provider with a port: rejected');
});

t.test('a reload reuses the values of unchanged providers (defaults filled in) and checks the rules across the whole', async (t) => {
  t.ok(compared > 20, `every case above was parsed both ways (${compared})`);
  if (!inForce.ok) return t.fail(inForce.error);
  // As apply writes it: the values in force, with their defaults, keys in another order.
  const written = Object.fromEntries(Object.entries(inForce.value).map(([name, p]) => [name, { ...p, tokenFile: p.tokenFile }]));
  const r = parseCatalog(JSON.stringify({ ...written, d: provider() }), inForce.value);
  if (!r.ok) return t.fail(r.error);
  t.equal(r.value.a, inForce.value.a, 'unchanged: the value in force');
  t.not(r.value.d, undefined);
  t.same(parseCatalog(JSON.stringify({ ...written, d: provider({ commands: [{ name: 'other' }] }) }), inForce.value), { ok: false, error: 'schema: command "other" is declared by two providers' }, 'a new provider clashing with an unchanged one');
});
