import { request } from 'undici';
import t from 'tap';
import { RenewAuthority } from '../../../src/dev/demo-gateway/authority.js';
import { DemoConnections } from '../../../src/dev/demo-gateway/demo-control.js';
import { DemoGateway } from '../../../src/dev/demo-gateway/demo-gateway.js';
import { HostControl } from '../../../src/dev/demo-gateway/host-control.js';
import { demoControlAnswerSchema } from '../../../src/dev/demo-wire.js';
import { memoryLogger } from '../../support/memory-log.js';
import type { TapTest } from '../../support/tap.js';

/** The demo platform's control surface on a real demo Gateway (port 0). */
async function start(t: TapTest): Promise<{ gw: DemoGateway; control: HostControl; connections: DemoConnections }> {
  const authority = new RenewAuthority({ credential: () => false, tokenLifetimeMs: 60_000 });
  const control = new HostControl({ authority });
  const gw = new DemoGateway(memoryLogger().log, authority, control);
  const connections = new DemoConnections(control, () => gw.baseUrl, { demo: 'demo_kept_id_0001' });
  gw.serveDemoControl(connections);
  await gw.listen(0);
  t.teardown(() => gw.close());
  return { gw, control, connections };
}

async function call(url: string, method: 'GET' | 'POST', headers: Record<string, string> = {}): Promise<{ status: number; body: string; location?: string }> {
  const res = await request(url, { method, headers });
  const body = await res.body.text();
  const location = res.headers.location;
  return { status: res.statusCode, body, location: typeof location === 'string' ? location : undefined };
}

t.test('connect and disconnect change the desired state (slots included); the list says so', async (t) => {
  const { gw, control, connections } = await start(t);
  t.equal(connections.bindingIds.demo, 'demo_kept_id_0001', 'a remembered id is kept');
  t.match(connections.bindingIds.sandbox, /^demo_[A-Za-z0-9_-]{22}$/, 'a new name gets a fresh id');
  const v0 = control.version;
  const r = await call(`${gw.baseUrl}/demo/connect/binding/sandbox`, 'POST', { accept: 'application/json' });
  t.equal(r.status, 200);
  const answer = demoControlAnswerSchema.parse(JSON.parse(r.body));
  t.equal(answer.version, v0 + 1, 'one new version');
  t.same(answer.connections.find((c) => c.name === 'sandbox'), { kind: 'binding', name: 'sandbox', connected: true });
  t.same(control.state().bindings[connections.bindingIds.sandbox as string], { instanceId: 'sandbox', upstreamUrl: `${gw.baseUrl}/mcp` });
  t.equal(gw.authority.slotState('instance:sandbox')?.revoked, false, 'its renewal slot exists');

  const form = await call(`${gw.baseUrl}/demo/connect/provider/demo`, 'POST', { origin: gw.baseUrl });
  t.equal(form.status, 303, 'a form post is sent back to the page');
  t.equal(form.location, '/demo');
  t.ok(control.state().providers.demo, 'provider demo in the state');
  await call(`${gw.baseUrl}/demo/disconnect/provider/demo`, 'POST');
  t.notOk(control.state().providers.demo, 'and out again');
  t.equal(gw.authority.slotState('cli:demo')?.revoked, true, 'its slot revoked: old tokens stop working');

  const page = await call(`${gw.baseUrl}/demo`, 'GET');
  t.equal(page.status, 200);
  t.match(page.body, 'action="/demo/disconnect/binding/sandbox"');
  t.match(page.body, 'action="/demo/connect/provider/demo"');
  t.notMatch(page.body, connections.bindingIds.sandbox as string, 'no binding id on the page');
});

t.test('refusals: foreign origin, unknown names, wrong methods', async (t) => {
  const { gw, control } = await start(t);
  const v0 = control.version;
  t.equal((await call(`${gw.baseUrl}/demo/connect/binding/demo`, 'POST', { origin: 'https://evil.example' })).status, 403, 'a page elsewhere cannot connect');
  t.equal((await call(`${gw.baseUrl}/demo/connect/binding/demo`, 'POST', { host: 'evil.example' })).status, 403, 'a rebinding Host is refused');
  t.equal((await call(`${gw.baseUrl}/demo/connect/binding/nope`, 'POST')).status, 404, 'unknown binding');
  t.equal((await call(`${gw.baseUrl}/demo/connect/provider/sandbox`, 'POST')).status, 404, 'unknown provider');
  t.equal((await call(`${gw.baseUrl}/demo/connect/widget/demo`, 'POST')).status, 404, 'unknown kind');
  t.equal((await call(`${gw.baseUrl}/demo/connect/binding/demo`, 'GET')).status, 405, 'a change needs POST');
  t.equal((await call(`${gw.baseUrl}/demo`, 'POST')).status, 405, 'the page is GET only');
  t.equal(control.version, v0, 'nothing changed');
});
