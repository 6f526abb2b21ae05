import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, writeToken } from '../test/support/cli-proc.js';
import { forwarderRig } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';

const BINDING = 'bind_passthrough_01';

const setup = (tt: TapTest) => forwarderRig(tt, { binding: BINDING, token: 'tok-passthrough-AAAA' });

t.test('1. JSON passes byte-identical both ways; upstream sees the file token', async (t) => {
  const { gw, url } = await setup(t);
  const reqBody = '{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"x":"ü \\u0000"}}';
  const resBody = Buffer.from('{"jsonrpc":"2.0","id":7,"result":{"tools":[]},"pad":"  \\n ✓"}');
  gw.handle((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': resBody.length });
    res.end(resBody);
  });
  const res = await request(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: reqBody,
  });
  const got = Buffer.from(await res.body.arrayBuffer());
  t.equal(res.statusCode, 200);
  t.ok(got.equals(resBody), 'response body byte-identical');
  t.equal(res.headers['content-length'], String(resBody.length), 'content-length passed through');
  const seen = gw.requests[0];
  t.ok(seen, 'upstream was called');
  t.equal(seen?.body.toString(), reqBody, 'request body byte-identical');
  t.equal(seen?.headers.authorization, 'Bearer tok-passthrough-AAAA');
  t.equal(seen?.url, '/mcp');
  t.match(seen?.headers['x-request-id'], /^[0-9a-f-]{36}$/, 'fresh x-request-id');
});

t.test('3. token hot swap: the very next request carries the new token', async (t) => {
  const { gw, url, tokenFile } = await setup(t);
  for (const token of ['tok-swap-one-1111', 'tok-swap-two-2222', 'tok-swap-three-3333']) {
    writeToken(tokenFile, token);
    const res = await request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    await res.body.dump();
    t.equal(res.statusCode, 200);
    t.equal(gw.requests.at(-1)?.headers.authorization, `Bearer ${token}`);
  }
});

checkNoLeaks(t);
