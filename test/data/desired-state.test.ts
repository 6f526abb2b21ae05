import t from 'tap';
import { performance } from 'node:perf_hooks';
import {
  MAX_BINDINGS,
  MAX_STATE_BYTES,
  ownListenerUpstream,
  parseDesiredState,
  parseDesiredStateAfter,
  slotsOf,
  toLocalConfig,
  type DesiredState,
} from '../../src/data/desired-state.js';
import { instancesFileSchema } from '../../src/data/registry.js';
import { parseCatalog } from '../../src/data/catalog.js';
import { stateLayout } from '../../src/data/state-layout.js';

const BID = 'bind_state_0001';
const SECRETISH = 'sk_live_do_not_echo_9f8e7d';

const binding = { instanceId: 'inst-a', upstreamUrl: 'https://gateway.example.com/mcp/inst-a' };
const provider = {
  upstream: 'https://api.notion.com',
  inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
  commands: [{ name: 'ntn', env: { NOTION_API_BASE_URL: '{baseUrl}', NOTION_TOKEN: '{placeholder}' } }],
};

function state(patch: { bindings?: Record<string, unknown>; providers?: Record<string, unknown>; version?: unknown } = {}): string {
  return JSON.stringify({ version: 7, bindings: { [BID]: binding }, providers: { notion: provider }, ...patch });
}

t.test('a valid state parses whole, with the catalog defaults filled in', async (t) => {
  const r = parseDesiredState(
    state({ providers: { notion: provider, gh: { upstream: 'http://127.0.0.1:9/api', inject: { type: 'query', name: 'access_token' } } } }),
  );
  t.ok(r.ok, r.ok ? '' : r.error);
  if (!r.ok) return;
  t.equal(r.value.version, 7);
  t.same(r.value.bindings[BID], binding);
  t.same(r.value.providers.gh?.commands, [], 'commands default to none');
  t.same(slotsOf(r.value), new Set(['instance:inst-a', 'cli:notion', 'cli:gh']));
});

t.test('the empty state is valid; unknown top-level fields are dropped', async (t) => {
  const r = parseDesiredState(JSON.stringify({ version: 0, bindings: {}, providers: {}, audit: { later: true } }));
  t.ok(r.ok);
  if (r.ok) t.same(Object.keys(r.value).sort(), ['bindings', 'providers', 'version']);
});

/** Each row is a whole state that one bad entry must reject; `why` must appear in the error. */
const rejected: Array<{ name: string; text: string; why: RegExp }> = [
  { name: 'not JSON', text: '{"version": 1, ', why: /invalid JSON/ },
  { name: 'version missing', text: JSON.stringify({ bindings: {}, providers: {} }), why: /version: expected number/ },
  { name: 'version negative', text: state({ version: -1 }), why: /version/ },
  { name: 'version not an integer', text: state({ version: 1.5 }), why: /version/ },
  { name: 'bindings missing', text: JSON.stringify({ version: 1, providers: {} }), why: /bindings/ },
  { name: 'binding upstream http to a public host', text: state({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://gateway.example.com/mcp' } } }), why: /http: only for a loopback host/ },
  { name: 'binding upstream ftp', text: state({ bindings: { [BID]: { ...binding, upstreamUrl: 'ftp://gateway.example.com/' } } }), why: /must be https/ },
  { name: 'binding upstream with credentials', text: state({ bindings: { [BID]: { ...binding, upstreamUrl: `https://u:${SECRETISH}@gw.example.com/` } } }), why: /must not carry credentials/ },
  { name: 'binding names a token path', text: state({ bindings: { [BID]: { ...binding, tokenFile: '/etc/shadow' } } }), why: /unknown property/ },
  { name: 'binding with an unknown field', text: state({ bindings: { [BID]: { ...binding, extra: SECRETISH } } }), why: /unknown property/ },
  { name: 'binding id too short', text: state({ bindings: { short: binding } }), why: /invalid key/ },
  { name: 'binding id with a slash', text: state({ bindings: { '../../../etc/x': binding } }), why: /invalid key/ },
  { name: 'binding key __proto__', text: `{"version":1,"providers":{},"bindings":{"__proto__":${JSON.stringify(binding)}}}`, why: /__proto__/ },
  { name: 'instanceId ..', text: state({ bindings: { [BID]: { ...binding, instanceId: '..' } } }), why: /not be \. or \.\./ },
  { name: 'instanceId .', text: state({ bindings: { [BID]: { ...binding, instanceId: '.' } } }), why: /not be \. or \.\./ },
  { name: 'instanceId ../x', text: state({ bindings: { [BID]: { ...binding, instanceId: '../x' } } }), why: /instanceId must match/ },
  { name: 'provider name ..', text: state({ providers: { '..': provider } }), why: /invalid key/ },
  { name: 'provider name .', text: state({ providers: { '.': provider } }), why: /invalid key/ },
  { name: 'provider name ../x', text: state({ providers: { '../x': provider } }), why: /invalid key/ },
  { name: 'provider key __proto__', text: `{"version":1,"bindings":{},"providers":{"__proto__":${JSON.stringify(provider)}}}`, why: /__proto__/ },
  { name: 'provider upstream http to a public host', text: state({ providers: { notion: { ...provider, upstream: 'http://api.notion.com' } } }), why: /http: only for a loopback host/ },
  { name: 'provider names a token path', text: state({ providers: { notion: { ...provider, tokenFile: '/root/x' } } }), why: /unknown property/ },
  ...['Host', 'connection', 'Content-Length', 'transfer-encoding', 'TE', 'trailer', 'upgrade', 'keep-alive'].map((h) => ({
    name: `reserved header ${h}`,
    text: state({ providers: { notion: { ...provider, inject: { type: 'header', name: h, value: 'Bearer {token}' } } } }),
    why: /connection header/,
  })),
  { name: 'header name with a space', text: state({ providers: { notion: { ...provider, inject: { type: 'header', name: 'X Bad', value: '{token}' } } } }), why: /not a valid header name/ },
  { name: 'inject template without {token}', text: state({ providers: { notion: { ...provider, inject: { type: 'header', name: 'Authorization', value: `Bearer ${SECRETISH}` } } } }), why: /must contain \{token\}/ },
  { name: 'command name ..', text: state({ providers: { notion: { ...provider, commands: [{ name: '..' }] } } }), why: /command name/ },
  { name: 'command name with a slash', text: state({ providers: { notion: { ...provider, commands: [{ name: '../bin/sh' }] } } }), why: /command name/ },
  {
    name: 'a command declared by two providers',
    text: state({ providers: { notion: provider, other: { ...provider, upstream: 'https://other.example.com' } } }),
    why: /declared by two providers/,
  },
  {
    name: 'a provider port named by two providers',
    text: state({ providers: { notion: { ...provider, port: 18310 }, other: { ...provider, upstream: 'https://other.example.com', commands: [], port: 18310 } } }),
    why: /port 18310 is named by two providers/,
  },
  { name: 'a provider port outside the range', text: state({ providers: { notion: { ...provider, port: 8080 } } }), why: /port must be in 18300-18399/ },
  { name: 'an arg with a line break', text: state({ providers: { notion: { ...provider, commands: [{ name: 'ntn', args: ['a\nb'] }] } } }), why: /CR, LF or NUL/ },
  { name: 'too many commands', text: state({ providers: { notion: { ...provider, commands: Array.from({ length: 65 }, (_, i) => ({ name: `c${i}` })) } } }), why: /at most 64 commands/ },
  { name: 'bindings not a record', text: state({ bindings: [binding] as unknown as Record<string, unknown> }), why: /bindings/ },
];

t.test('one bad entry rejects the whole state, and the error never echoes a value', async (t) => {
  for (const row of rejected) {
    const r = parseDesiredState(row.text);
    t.notOk(r.ok, `${row.name}: rejected`);
    if (r.ok) continue;
    t.match(r.error, row.why, `${row.name}: says why (${r.error})`);
    t.notMatch(r.error, SECRETISH, `${row.name}: no value echoed`);
    t.notMatch(r.error, BID, `${row.name}: the binding id appears only as a prefix`);
    t.notMatch(r.error, /gateway\.example\.com|api\.notion\.com|\/etc\/|\/root\//, `${row.name}: no URL or path echoed`);
  }
});

t.test('after a valid state: the same rejections with the same errors, whatever was valid before', async (t) => {
  // The last good state holds every id and name the rows use, so a bad row is a changed entry, a new one, or both.
  const before = parseDesiredStateAfter(state({ bindings: { [BID]: binding, bind_state_0002: binding }, providers: { notion: provider, other: { ...provider, upstream: 'https://other.example.com', commands: [] } } }));
  t.ok(before.result.ok && before.validated);
  for (const row of rejected) {
    const full = parseDesiredState(row.text);
    const after = parseDesiredStateAfter(row.text, before.validated);
    t.same(after.result, full, `${row.name}: ${full.ok ? '' : full.error}`);
    t.notOk(after.validated, `${row.name}: nothing to compare against next time`);
  }
});

t.test('after a valid state: unchanged entries are reused, changed and new ones validated, the order and the whole kept', async (t) => {
  const gh = { upstream: 'http://127.0.0.1:9/api', inject: { type: 'query', name: 'access_token' } };
  const first = parseDesiredStateAfter(state({ bindings: { [BID]: binding, bind_state_0002: { ...binding, instanceId: 'inst-b' } }, providers: { notion: provider, gh } }));
  if (!first.result.ok || !first.validated) return t.fail('first state');
  const text = state({ version: 8, bindings: { bind_state_0003: { ...binding, instanceId: 'inst-c' }, [BID]: binding }, providers: { gh, notion: { ...provider, port: 18310 } } });
  const next = parseDesiredStateAfter(text, first.validated);
  if (!next.result.ok) return t.fail(next.result.error);
  t.same(next.result, parseDesiredState(text), 'what the full parse gives');
  t.same(Object.keys(next.result.value.bindings), ['bind_state_0003', BID], 'in the order of the text');
  t.equal(next.result.value.bindings[BID], first.result.value.bindings[BID], 'an unchanged binding: the value validated before');
  t.equal(next.result.value.providers.gh, first.result.value.providers.gh, 'an unchanged provider: the value validated before, defaults and all');
  t.not(next.result.value.providers.notion, first.result.value.providers.notion, 'a changed provider: validated again');
  t.same(next.result.value.providers.gh?.commands, []);
  // A rule across providers fails on the whole, though each entry is fine and only one changed.
  const clash = state({ version: 9, bindings: {}, providers: { gh: { ...gh, commands: [{ name: 'ntn' }] }, notion: provider } });
  t.same(parseDesiredStateAfter(clash, next.validated).result, parseDesiredState(clash));
  t.notOk(parseDesiredState(clash).ok);
});

t.test('a good entry beside a bad one does not survive: nothing is partially accepted', async (t) => {
  const r = parseDesiredState(state({ bindings: { [BID]: binding, bind_state_0002: { ...binding, upstreamUrl: 'http://evil.example/' } } }));
  t.notOk(r.ok);
});

t.test(`the bounds: ${MAX_BINDINGS} bindings parse quickly, one more is refused, an oversized body is refused unread`, async (t) => {
  const many: Record<string, typeof binding> = {};
  for (let i = 0; i < MAX_BINDINGS; i++) many[`bind_${String(i).padStart(8, '0')}`] = { instanceId: `inst-${i}`, upstreamUrl: `https://gw.example.com/mcp/${i}` };
  const text = state({ bindings: many });
  const started = performance.now();
  const r = parseDesiredState(text);
  const ms = performance.now() - started;
  // Measured on the 2-core dev box: 0.9 MB, 10 000 bindings parse in 30-70 ms alone, ~110 ms
  // under tap. The bound below only catches a pathological regression (e.g. quadratic checks).
  t.ok(r.ok, r.ok ? '' : r.error);
  if (r.ok) t.equal(Object.keys(r.value.bindings).length, MAX_BINDINGS);
  t.ok(ms < 2_000, `parsed ${MAX_BINDINGS} bindings (${(text.length / 1e6).toFixed(1)} MB) in ${ms.toFixed(0)} ms`);

  const over = parseDesiredState(state({ bindings: { ...many, bind_x_overflow: binding } }));
  t.notOk(over.ok);
  if (!over.ok) t.match(over.error, /more than 10000 bindings/);

  const huge = parseDesiredState(`${' '.repeat(MAX_STATE_BYTES)}{}`);
  t.notOk(huge.ok);
  if (!huge.ok) t.match(huge.error, /larger than/);
});

t.test('toLocalConfig: host-chosen token paths, and files the forwarder and cli-proxy accept', async (t) => {
  const layout = stateLayout('/var/lib/agent-connectors');
  const parsed = parseDesiredState(state({ bindings: { [BID]: binding, bind_state_0002: { instanceId: 'inst-a', upstreamUrl: 'https://gw.example.com/other' } } }));
  t.ok(parsed.ok);
  if (!parsed.ok) return;
  const { instances, catalog } = toLocalConfig(parsed.value, layout);
  t.same(instances, {
    [BID]: { ...binding, tokenFile: '/var/lib/agent-connectors/mcp-forwarder/inst-a.token' },
    bind_state_0002: { instanceId: 'inst-a', upstreamUrl: 'https://gw.example.com/other', tokenFile: '/var/lib/agent-connectors/mcp-forwarder/inst-a.token' },
  });
  t.same(catalog, { notion: { ...provider, tokenFile: '/var/lib/agent-connectors/cli-proxy/notion.token' } });
  t.ok(instancesFileSchema.safeParse(instances).success, 'instances.json schema accepts it');
  t.ok(parseCatalog(JSON.stringify(catalog)).ok, 'providers.json parser accepts it');

  const empty: DesiredState = { version: 3, bindings: {}, providers: {} };
  t.same(toLocalConfig(empty, layout), { instances: {}, catalog: {} });
});

t.test('ownListenerUpstream: an upstream at one of the host\'s own listener ports is named; other loopback ports are not', async (t) => {
  const parse = (patch: Parameters<typeof state>[0]): DesiredState => {
    const r = parseDesiredState(state(patch));
    if (!r.ok) throw new Error(r.error);
    return r.value;
  };
  const ports = [14323, 14324, 9464];
  t.equal(ownListenerUpstream(parse({}), ports), undefined, 'https upstreams elsewhere');
  t.equal(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:8080/mcp' } } }), ports), undefined, 'another loopback port');
  t.match(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:14323/i/x/mcp' } } }), ports), /binding.*port 14323/);
  t.match(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://[::1]:14324/p' } } }), ports), /port 14324/, 'IPv6 loopback');
  t.match(ownListenerUpstream(parse({ providers: { notion: { ...provider, upstream: 'https://localhost:9464' } } }), ports), /provider.*port 9464/, 'https by name too');
  t.equal(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'https://gateway.example.com:14323/mcp' } } }), ports), undefined, 'the same port elsewhere');
  t.match(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:0014323/i/x/mcp' } } }), ports), /port 14323/, 'leading zeros');
  t.match(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:143\t2\n3/i/x/mcp' } } }), ports), /port 14323/, 'split by what the URL parser drops');
  t.match(ownListenerUpstream(parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://localhost/mcp' } } }), [80]), /port 80/, 'a default port');
  // The answer is kept per binding value and set of ports: the same value under other ports is asked again.
  const one = parse({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:8080/mcp' } } });
  t.equal(ownListenerUpstream(one, ports), undefined, 'kept: not a listener');
  t.match(ownListenerUpstream(one, [8080]), /port 8080/, 'the same value, other ports');
  t.equal(ownListenerUpstream(one, ports), undefined, 'and back');
  const next = parseDesiredStateAfter(state({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:8080/mcp' }, 'another-binding-id': { ...binding, upstreamUrl: 'http://127.0.0.1:14324/p' } } }), parseDesiredStateAfter(state({ bindings: { [BID]: { ...binding, upstreamUrl: 'http://127.0.0.1:8080/mcp' } } })).validated);
  t.ok(next.result.ok);
  if (next.result.ok) t.match(ownListenerUpstream(next.result.value, ports), /port 14324/, 'a reused value beside a new one');
});
