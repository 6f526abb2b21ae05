import t from 'tap';
import type { ParseResult } from '../../src/data/parse.js';
import { parseInstancesFile as parseWhole, type InstancesFile } from '../../src/data/registry.js';

const ID = 'bind_schema_0001';
const good = {
  instanceId: 'inst-a',
  upstreamUrl: 'https://gateway.example.com/mcp',
  tokenFile: '/var/lib/agent-connectors/mcp-forwarder/inst-a.token',
};

/**
 * Every parse in this file runs twice: whole, and as the forwarder's reload does, given a
 * registry in force that shares ids (and values) with the cases; both must agree exactly.
 */
const IN_FORCE: InstancesFile = {
  [ID]: good,
  'other-binding_ID-2': { instanceId: 'inst.b_2', upstreamUrl: 'http://127.0.0.1:8080/mcp', tokenFile: '/tmp/b.token' },
  bind_unchanged_0009: { ...good, instanceId: 'inst-9' },
};
let reusedCompared = 0;
function parseInstancesFile(text: string): ParseResult<InstancesFile> {
  const whole = parseWhole(text);
  const reload = parseWhole(text, IN_FORCE);
  if (JSON.stringify(reload) !== JSON.stringify(whole)) throw new Error(`a reload parse differs from the whole parse: ${JSON.stringify(reload)} vs ${JSON.stringify(whole)}`);
  reusedCompared += 1;
  return whole;
}

function file(bindings: Record<string, unknown>): string {
  return JSON.stringify(bindings, null, 2);
}

function withBinding(patch: Record<string, unknown>, id = ID): string {
  return file({ [id]: { ...good, ...patch } });
}

function errorOf(r: ParseResult<InstancesFile>): string {
  return r.ok ? '' : r.error;
}

t.test('a valid file parses to its bindings', async (t) => {
  const text = file({
    [ID]: good,
    'other-binding_ID-2': { instanceId: 'inst.b_2', upstreamUrl: 'http://127.0.0.1:8080/mcp', tokenFile: '/tmp/b.token' },
  });
  const r = parseInstancesFile(text);
  t.ok(r.ok, errorOf(r));
  if (r.ok) {
    t.strictSame(Object.keys(r.value).sort(), [ID, 'other-binding_ID-2'].sort());
    t.same(r.value[ID], good);
  }
});

t.test('an empty object is an empty registry', async (t) => {
  const r = parseInstancesFile('{}');
  t.ok(r.ok);
  if (r.ok) t.strictSame(Object.keys(r.value), []);
});

t.test('upstreamUrl: https to any host is accepted', async (t) => {
  for (const u of [
    'https://gateway.example.com/mcp',
    'https://gw.example.com:8443/v1/mcp?x=1',
    'https://10.0.0.1/mcp',
    'https://192.168.1.5:9443/mcp',
    'https://[2001:db8::1]/mcp',
    'https://127.0.0.1/mcp',
  ]) {
    const r = parseInstancesFile(withBinding({ upstreamUrl: u }));
    t.ok(r.ok, `${u}: ${errorOf(r)}`);
  }
});

t.test('upstreamUrl: http only to a loopback host', async (t) => {
  for (const u of [
    'http://127.0.0.1/mcp',
    'http://127.0.0.1:9/mcp',
    'http://127.1.2.3:8080/mcp',
    'http://[::1]:8080/mcp',
    'http://localhost/mcp',
    'http://localhost:3000/mcp',
    'http://LOCALHOST:3000/mcp',
  ]) {
    const r = parseInstancesFile(withBinding({ upstreamUrl: u }));
    t.ok(r.ok, `${u}: ${errorOf(r)}`);
  }
  for (const u of [
    'http://gateway.example.com/mcp',
    'http://10.0.0.1/mcp',
    'http://192.168.1.5/mcp',
    'http://0.0.0.0:8080/mcp',
    'http://[::]:8080/mcp',
    'http://127.0.0.1.evil.example/mcp',
    'http://localhost.evil.example/mcp',
  ]) {
    const r = parseInstancesFile(withBinding({ upstreamUrl: u }));
    t.notOk(r.ok, `${u} rejected`);
    t.match(errorOf(r), /upstreamUrl/, 'error names the field');
  }
});

t.test('upstreamUrl: other schemes, credentials and garbage are rejected', async (t) => {
  for (const u of [
    'ftp://gateway.example.com/mcp',
    'file:///etc/passwd',
    'ws://127.0.0.1/mcp',
    'wss://gateway.example.com/mcp',
    'javascript:alert(1)',
    'https://user:pass@gateway.example.com/mcp',
    'https://user@gateway.example.com/mcp',
    'http://user:pass@127.0.0.1/mcp',
    'not a url',
    '//gateway.example.com/mcp',
    '/mcp',
    '',
  ]) {
    t.notOk(parseInstancesFile(withBinding({ upstreamUrl: u })).ok, `${JSON.stringify(u)} rejected`);
  }
  t.notOk(parseInstancesFile(withBinding({ upstreamUrl: 42 })).ok, 'a number is rejected');
  t.notOk(parseInstancesFile(withBinding({ upstreamUrl: null })).ok, 'null is rejected');
});

t.test('tokenFile must be an absolute path', async (t) => {
  for (const p of ['inst-a.token', './inst-a.token', '../x.token', 'mcp-forwarder/inst-a.token', '~/x.token', '']) {
    const r = parseInstancesFile(withBinding({ tokenFile: p }));
    t.notOk(r.ok, `${JSON.stringify(p)} rejected`);
    t.match(errorOf(r), /tokenFile/);
  }
  t.notOk(parseInstancesFile(withBinding({ tokenFile: ['/x'] })).ok, 'an array is rejected');
});

t.test('each binding needs all of instanceId, upstreamUrl, tokenFile', async (t) => {
  for (const key of ['instanceId', 'upstreamUrl', 'tokenFile'] as const) {
    const partial: Record<string, string> = { ...good };
    delete partial[key];
    const r = parseInstancesFile(file({ [ID]: partial }));
    t.notOk(r.ok, `missing ${key} rejected`);
  }
  t.notOk(parseInstancesFile(file({ [ID]: null })).ok);
  t.notOk(parseInstancesFile(file({ [ID]: 'https://gw/mcp' })).ok);
  t.notOk(parseInstancesFile(withBinding({ instanceId: '' })).ok, 'empty instanceId rejected');
  t.notOk(parseInstancesFile(withBinding({ instanceId: '../../etc' })).ok, 'instanceId with a slash rejected');
});

t.test('bindingId keys: [A-Za-z0-9_-]{8,128}', async (t) => {
  for (const id of ['abcdefgh', 'A'.repeat(128), 'a-b_c-D9', '________', '--------', '12345678']) {
    const r = parseInstancesFile(file({ [id]: good }));
    t.ok(r.ok, `${id.length} chars "${id.slice(0, 12)}" accepted: ${errorOf(r)}`);
  }
  for (const id of [
    'abcdefg',
    'A'.repeat(129),
    '',
    'abc.defgh',
    'abcd/efgh',
    'abcd efgh',
    'abcdéfgh',
    'abcdefgh\n',
    'abcd%2fefgh',
    'abcd:efgh',
    'abcd+efgh',
  ]) {
    t.notOk(parseInstancesFile(file({ [id]: good })).ok, `${JSON.stringify(id.slice(0, 20))} (${id.length} chars) rejected`);
  }
});

t.test('one bad binding rejects the whole file', async (t) => {
  const r = parseInstancesFile(file({ [ID]: good, 'second_binding': { ...good, upstreamUrl: 'http://gw.example.com/' } }));
  t.notOk(r.ok);
});

t.test('unknown properties are rejected', async (t) => {
  t.notOk(parseInstancesFile(withBinding({ extra: 1 })).ok, 'unknown binding property');
  t.notOk(parseInstancesFile(withBinding({ token: 'abc' })).ok, 'a token pasted into the registry');
  t.notOk(parseInstancesFile(withBinding({ UpstreamUrl: 'https://x/' })).ok, 'wrong-case duplicate property');
});

t.test('non-object documents and bad JSON are rejected', async (t) => {
  for (const text of ['', ' ', '[]', '[1]', 'null', '"x"', '42', 'true', '{', '{"a":1,}', '{"abcdefgh": {}} trailing', '\u0000']) {
    const r = parseInstancesFile(text);
    t.notOk(r.ok, `${JSON.stringify(text)} rejected`);
    if (!r.ok) t.type(r.error, 'string');
  }
});

const SECRET = 'SECRET123';

t.test('errors never echo the file text', async (t) => {
  const cases: Record<string, string> = {
    'bad JSON around a secret': `{"${ID}": {"instanceId": "${SECRET}", "upstreamUrl": "https://x/",`,
    'bad JSON value': `{"${ID}": ${SECRET}}`,
    'a secret as an unknown property value': withBinding({ note: SECRET }),
    'a secret as an unknown property name': withBinding({ [`apiKey_${SECRET}`]: 'x' }),
    'a secret in upstreamUrl credentials': withBinding({ upstreamUrl: `https://user:${SECRET}@gateway.example.com/mcp` }),
    'a secret as a bad upstreamUrl': withBinding({ upstreamUrl: `${SECRET}` }),
    'a secret in an http upstream host': withBinding({ upstreamUrl: `http://${SECRET}.example.com/mcp` }),
    'a secret as a relative tokenFile': withBinding({ tokenFile: `${SECRET}.token` }),
    'a secret as a bad instanceId': withBinding({ instanceId: `${SECRET} with spaces` }),
    'a secret as the binding value': file({ [ID]: SECRET }),
    'a secret in an invalid binding id': file({ [`${SECRET}!`]: good }),
    'a secret in a too-long binding id': file({ [`abcd${SECRET}${'x'.repeat(130)}`]: good }),
    'a secret inside an object-typed field': withBinding({ tokenFile: { value: SECRET } }),
  };
  for (const [name, text] of Object.entries(cases)) {
    t.ok(text.includes(SECRET), `${name}: the case carries the secret`);
    const r = parseInstancesFile(text);
    t.notOk(r.ok, `${name}: rejected`);
    t.notMatch(errorOf(r), SECRET, `${name}: error does not contain the secret (got ${JSON.stringify(errorOf(r))})`);
  }
});

t.test('errors show only a prefix of a binding id', async (t) => {
  const id = 'bindingCapability_0123456789abcdef';
  for (const patch of [{ upstreamUrl: 'http://gateway.example.com/' }, { tokenFile: 'relative' }, { extra: true }]) {
    const r = parseInstancesFile(withBinding(patch, id));
    t.notOk(r.ok);
    const err = errorOf(r);
    t.notMatch(err, id, 'full binding id not shown');
    t.notMatch(err, id.slice(0, 12), 'no long prefix shown');
    t.match(err, id.slice(0, 4), 'a short prefix identifies the binding');
  }
});

t.test('a reload reuses the values of unchanged bindings and validates the rest, as the whole parse would', async (t) => {
  t.ok(reusedCompared > 20, `every case above was parsed both ways (${reusedCompared})`);
  const text = file({ ...IN_FORCE, bind_new_0001: { ...good, instanceId: 'inst-new' } });
  const r = parseWhole(text, IN_FORCE);
  if (!r.ok) return t.fail(r.error);
  t.equal(r.value[ID], IN_FORCE[ID], 'unchanged: the value in force');
  t.same(Object.keys(r.value), [ID, 'other-binding_ID-2', 'bind_unchanged_0009', 'bind_new_0001'], 'in the order of the file');
  const changed = parseWhole(file({ ...IN_FORCE, [ID]: { ...good, upstreamUrl: 'http://evil.example/mcp' } }), IN_FORCE);
  t.notOk(changed.ok, 'a changed binding is validated again');
  const proto = parseWhole(`{"__proto__": ${JSON.stringify(good)}, "${ID}": ${JSON.stringify(good)}}`, IN_FORCE);
  t.same(proto, parseWhole(`{"__proto__": ${JSON.stringify(good)}, "${ID}": ${JSON.stringify(good)}}`), 'a __proto__ key: as the whole parse');
  if (proto.ok) t.notOk(Object.hasOwn(proto.value, '__proto__'));
});
