import t from 'tap';
import { mcpCallOf } from '../../src/forwarder/route.js';

const b = (v: unknown): Buffer => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v));

t.test('tools/call: tool name from params.name in any key order, and the JSON-RPC id', async (t) => {
  // The SDK's own order puts method first and id last.
  t.same(mcpCallOf({}, b({ method: 'tools/call', params: { name: 'search', arguments: { q: 'secret-value' } }, jsonrpc: '2.0', id: 7 })), {
    method: 'tools/call',
    tool: 'search',
    id: 7,
  });
  t.same(mcpCallOf({}, b({ jsonrpc: '2.0', id: 'req-1', params: { arguments: {}, name: 'fetch' }, method: 'tools/call' })), {
    method: 'tools/call',
    tool: 'fetch',
    id: 'req-1',
  });
});

t.test('the Mcp-Name and Mcp-Method headers win over the body', async (t) => {
  const body = b({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'from-body' } });
  t.same(mcpCallOf({ method: 'tools/call', name: 'from-header' }, body), { method: 'tools/call', tool: 'from-header', id: 1 });
  t.same(mcpCallOf({ name: 'from-header' }, body).tool, 'from-header');
});

t.test('never an argument value; names and ids are capped', async (t) => {
  const call = mcpCallOf({}, b({ jsonrpc: '2.0', id: 'i'.repeat(500), method: 'tools/call', params: { name: 'n'.repeat(500), arguments: { token: 'secret-value' } } }));
  t.equal(call.tool?.length, 128);
  t.equal(typeof call.id === 'string' ? call.id.length : 0, 64);
  t.notMatch(JSON.stringify(call), /secret-value/);
});

t.test('other methods carry no tool or id; unparseable or oversized bodies lose only detail', async (t) => {
  t.same(mcpCallOf({}, b({ jsonrpc: '2.0', id: 2, method: 'tools/list' })), { method: 'tools/list' });
  t.same(mcpCallOf({}, b('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"')), { method: 'tools/call' }, 'truncated JSON: method off the head only');
  const big = b({ jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'big', arguments: { blob: 'x'.repeat(70 * 1024) } } });
  t.same(mcpCallOf({ method: 'tools/call' }, big), { method: 'tools/call' }, 'a body over 64 KiB is not parsed');
  t.same(mcpCallOf({ method: 'tools/call', name: 'big' }, big), { method: 'tools/call', tool: 'big' }, 'the header still names it');
  t.same(mcpCallOf({}, Buffer.alloc(0)), {});
  t.same(mcpCallOf({}, b({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 42 } })), { method: 'tools/call', id: 5 }, 'a non-string name is ignored');
});

/** What parsing the whole message says (the reading before the scan): the scan must agree with it. */
function parsed(body: Buffer): { method: string; tool?: string; id?: string | number } {
  const call: { method: string; tool?: string; id?: string | number } = { method: 'tools/call' };
  let msg: unknown;
  try {
    msg = JSON.parse(body.toString('utf8'));
  } catch {
    return call;
  }
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return call;
  const m = msg as { id?: unknown; params?: { name?: unknown } };
  if (typeof m.params?.name === 'string') call.tool = m.params.name.slice(0, 128);
  if (typeof m.id === 'number' && Number.isFinite(m.id)) call.id = m.id;
  else if (typeof m.id === 'string') call.id = m.id.slice(0, 64);
  return call;
}

t.test('tools/call read without parsing agrees with parsing', async (t) => {
  const cases = [
    '{"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}},"jsonrpc":"2.0","id":12}',
    ' {\n\t"method" : "tools/call" ,\r\n "params" : { "arguments" : { "name" : "inner" , "n" : [1, {"name": "deep"}] } , "name" : "outer" } , "id" : "a-1" } \n',
    '{"method":"tools/call","params":{"arguments":{"name":"only-inside"}},"id":1}',
    '{"method":"tools/call","params":{"name":"first"},"params":{"name":"second"},"id":1,"id":2}',
    '{"method":"tools/call","params":{"name":"kept"},"params":{},"id":3}',
    '{"method":"tools/call","params":{"name":"a"},"params":[1,2],"id":4}',
    '{"method":"tools/call","id":"x","id":null}',
    '{"method":"tools/call","id":1.5e3}',
    '{"method":"tools/call","id":-0.25}',
    '{"method":"tools/call","id":1e400}',
    '{"method":"tools/call","id":true}',
    '{"method":"tools/call","id":{"n":1}}',
    '{"method":"tools/call","id":0x10}',
    '{"method":"tools/call","id":01}',
    '{"method":"tools/call","params":{"name":"q\\"uote"},"id":"e\\\\sc"}',
    '{"method":"tools/call","params":{"name":"caf\\u00e9"},"id":"\\u0041"}',
    '{"method":"tools/call","params":{"na\\u006de":"escaped-key"},"i\\u0064":9}',
    '{"method":"tools/call","params":{"name":"café ✓"},"id":"ü"}',
    '{"method":"tools/call","params":{"name":"ctl\u0001"},"id":1}',
    '{"method":"tools/call","params":{"arguments":{"s":"a\\\\"},"name":"after-backslashes"},"id":5}',
    '{"method":"tools/call","params":{"arguments":"}{\\"name\\":\\"fake\\"}","name":"real"},"id":6}',
    '{"method":"tools/call","params":{"name":"x"},"id":7}  trailing',
    '{"method":"tools/call","params":{"name":"x"},"id":7}}',
    '{"method":"tools/call","params":{"name":"x"} "id":7}',
    '{"method":"tools/call","params":{"name" "x"},"id":7}',
    '{"method":"tools/call","params":{"name":"x",},"id":7}',
    '{"method":"tools/call","params":{}, "id":8}',
    '{"method":"tools/call"}',
    '[{"method":"tools/call","params":{"name":"in-batch"},"id":1}]',
  ];
  for (const c of cases) {
    const body = Buffer.from(c);
    t.same(mcpCallOf({ method: 'tools/call' }, body), parsed(body), c);
  }
});

t.test('a tools/call cut anywhere is read as parsing reads it', async (t) => {
  const full = JSON.stringify({ method: 'tools/call', params: { name: 'echo', arguments: { text: 'a"b\\c', list: [1, { name: 'x' }] } }, jsonrpc: '2.0', id: 'r-9' });
  for (let n = 1; n <= full.length; n++) {
    const body = Buffer.from(full.slice(0, n));
    const got = mcpCallOf({ method: 'tools/call' }, body);
    const want = parsed(body);
    if (JSON.stringify(got) !== JSON.stringify(want)) t.fail(`cut at ${n}: ${JSON.stringify(got)} ≠ ${JSON.stringify(want)}`);
  }
  t.same(mcpCallOf({ method: 'tools/call' }, Buffer.from(full)), { method: 'tools/call', tool: 'echo', id: 'r-9' });
});

t.test('random messages: the scan and parsing agree', async (t) => {
  let seed = 23;
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const strings = ['echo', 'name', 'id', 'params', 'a"b', 'back\\slash', 'ünï', '', '}{', '\\u0041', 'x'.repeat(300)];
  const value = (depth: number): unknown => {
    switch (rand(depth > 2 ? 4 : 6)) {
      case 0:
        return strings[rand(strings.length)];
      case 1:
        return rand(3) === 0 ? -rand(1000) / 8 : rand(100000);
      case 2:
        return [true, false, null][rand(3)];
      case 3:
        return strings[rand(strings.length)];
      case 4:
        return Array.from({ length: rand(4) }, () => value(depth + 1));
      default:
        return Object.fromEntries(Array.from({ length: rand(4) }, () => [strings[rand(strings.length)], value(depth + 1)]));
    }
  };
  let disagreements = 0;
  for (let k = 0; k < 3000; k++) {
    const keys = ['method', 'params', 'id', 'jsonrpc', 'extra'].filter(() => rand(4) !== 0);
    const parts = keys.map((key) => {
      const v = key === 'method' ? 'tools/call' : key === 'params' && rand(3) !== 0 ? { name: value(3), arguments: value(1) } : value(1);
      return `${JSON.stringify(key)}${[':', ' : ', ':\n'][rand(3)]}${JSON.stringify(v, null, rand(4) === 0 ? 1 : undefined)}`;
    });
    if (rand(5) === 0) parts.push(parts[rand(parts.length)] ?? '"id":1');
    const text = `${[' ', '', '\n'][rand(3)]}{${parts.join([',', ' , ', ',\n'][rand(3)])}}`;
    const body = Buffer.from(rand(6) === 0 ? text.slice(0, rand(text.length)) : text);
    if (JSON.stringify(mcpCallOf({ method: 'tools/call' }, body)) !== JSON.stringify(parsed(body))) {
      disagreements++;
      t.fail(body.toString());
    }
  }
  t.equal(disagreements, 0);
});
