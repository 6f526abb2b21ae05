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
