/**
 * The test aids (`--resolve`, `--upstream-ca`, SPEC §10) apply to a base-url provider's
 * https upstream too (issue 20 item 6): a lab serves a base-url CLI's fake SaaS under its
 * real https host name, as it does for TLS mode. Without them the same upstream is the
 * real host, out of reach here.
 */
import { spawnSync } from 'node:child_process';
import { createServer } from 'node:https';
import type { IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, writeToken } from '../test/support/cli-proc.js';
import { startProxy } from '../test/support/proxy-rig.js';
import { issueServerCert, makeTestCa, tlsLabDirs } from '../test/support/test-ca.js';

const TOKEN = `tok-baseurl-https-REAL-${process.pid}-7d1f`;
const HOST = 'api.example-saas.com';

if (spawnSync('openssl', ['version']).error !== undefined) {
  t.plan(0, 'needs openssl (the test CA)');
} else {
  const { state, pki } = tlsLabDirs(t, 'ac-cli-baseurl-https-');
  makeTestCa(pki, 'base-url https test CA');
  const seen: Array<{ url: string; headers: IncomingHttpHeaders }> = [];
  const server = createServer(issueServerCert(pki, 'saas', [HOST]), (req, res) => {
    seen.push({ url: req.url ?? '', headers: req.headers });
    const ok = req.headers.authorization === `Bearer ${TOKEN}`;
    const text = JSON.stringify(ok ? { who: 'real-user' } : { error: 'unauthorized' });
    res.writeHead(ok ? 200 : 401, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const port = (server.address() as AddressInfo).port;
  const tokenFile = join(state, 'cli-proxy', 'saas.token');
  writeToken(tokenFile, TOKEN);
  const catalog = {
    saas: {
      upstream: `https://${HOST}/v1`,
      tokenFile,
      inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      commands: [{ name: 'saascli', env: { SAAS_API_URL: '{baseUrl}', SAAS_TOKEN: '{placeholder}' } }],
    },
  };
  const proxy = await startProxy(t, 'cli-proxy', {
    stateDir: state,
    config: catalog,
    args: ['--resolve', `${HOST}:443:127.0.0.1:${port}`, '--upstream-ca', join(pki, 'ca.pem')],
  });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);

  t.test('a base-url call reaches the https fake under its real name, verified against --upstream-ca, with the token', async (t) => {
    const r = await request(`${proxy.base}/p/saas/users/me?x=1`, { headers: { authorization: 'Bearer agent-connectors-placeholder' } });
    const body = await r.body.text();
    t.equal(r.statusCode, 200, `200 from the fake (${body})`);
    t.same(JSON.parse(body), { who: 'real-user' });
    t.equal(seen.length, 1, 'the fake got the call');
    t.equal(seen[0]?.url, '/v1/users/me?x=1', 'the upstream\'s path kept, the CLI\'s path and query appended');
    t.equal(seen[0]?.headers.host, HOST, 'under the real host name');
    t.equal(seen[0]?.headers.authorization, `Bearer ${TOKEN}`, 'the real token, the placeholder stripped');
  });

  checkNoLeaks(t);
}
