import { renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, writeToken } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { loadConfig, startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { assertJsonError } from './helpers/http-raw.js';

/**
 * A provider's token rotating under a SaaS that honours only the newest token: a request
 * with a small or no body waits for the renewed token file and is sent again; a streamed
 * upload cannot be and says so; a 401 with no rotation is relayed to the CLI as it came.
 */

interface Rig {
  saas: MockGateway;
  proxy: ProxyProc;
  base: string;
  mint: (token: string) => void;
  /** Writes `token` (default: the one the SaaS accepts now) as the renewal would. */
  apply: (token?: string) => void;
  tokenFile: string;
}

async function rig(t: TapTest, waitMs?: number): Promise<Rig> {
  const saas = await MockGateway.start();
  t.teardown(() => saas.close());
  const stateDir = tempDir('ac-cli-rot-', t);
  const tokenFile = join(stateDir, 'cli-proxy', 'acme.token');
  const catalog = { acme: { upstream: saas.url('/api'), tokenFile, inject: { type: 'header', name: 'authorization', value: 'Bearer {token}' } } };
  const proxy = await startProxy(t, 'cli-proxy', { stateDir, config: catalog, args: waitMs === undefined ? [] : ['--token-wait-ms', String(waitMs)] });
  let accepted = 'tok-cli-rot-0-AAAA';
  writeToken(tokenFile, accepted);
  saas.handle((req, res) => {
    if (req.headers.authorization !== `Bearer ${accepted}`) return json(res, 401, { message: 'Bad credentials' }, { 'www-authenticate': 'Bearer' });
    json(res, 200, { ok: true, got: req.body.length });
  });
  return {
    saas,
    proxy,
    base: `${proxy.base}/p/acme`,
    mint: (token) => {
      accepted = token;
    },
    apply: (token = accepted) => {
      writeToken(`${tokenFile}.new`, token);
      renameSync(`${tokenFile}.new`, tokenFile);
    },
    tokenFile,
  };
}

t.test('GET and a small POST meeting a rotation are sent again with the new token', async (t) => {
  const r = await rig(t);
  r.mint('tok-cli-rot-1-BBBB');
  const get = request(`${r.base}/repos`);
  await r.saas.waitForRequests(1);
  r.apply();
  const res = await get;
  t.equal(res.statusCode, 200);
  await res.body.text();
  t.same(r.saas.requests.map((q) => q.headers.authorization), ['Bearer tok-cli-rot-0-AAAA', 'Bearer tok-cli-rot-1-BBBB']);

  r.mint('tok-cli-rot-2-CCCC');
  const body = JSON.stringify({ title: 'x'.repeat(1000) });
  const post = request(`${r.base}/issues`, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
  await r.saas.waitForRequests(3);
  r.apply();
  const res2 = await post;
  t.equal(res2.statusCode, 200);
  t.same(await res2.body.json(), { ok: true, got: Buffer.byteLength(body) }, 'the retry carried the whole body');
  t.equal(r.saas.requests[3]?.body.toString(), body);
  checkNoLeaks(t);
});

t.test('a retry that meets the next rotation waits for that one too: the CLI sees 200', async (t) => {
  const r = await rig(t);
  // Held at the exact moment: the SaaS honours a second renewal before the file got the first.
  r.mint('tok-cli-rot-5-FFFF');
  const get = request(`${r.base}/repos`);
  await r.saas.waitForRequests(1);
  r.mint('tok-cli-rot-6-GGGG');
  r.apply('tok-cli-rot-5-FFFF');
  await r.saas.waitForRequests(2);
  r.apply();
  const res = await get;
  t.equal(res.statusCode, 200, 'the CLI sees 200, not the superseded 401');
  await res.body.text();
  t.same(
    r.saas.requests.map((q) => q.headers.authorization),
    ['Bearer tok-cli-rot-0-AAAA', 'Bearer tok-cli-rot-5-FFFF', 'Bearer tok-cli-rot-6-GGGG'],
    'the request, a retry with the superseded renewal, a retry with the current one',
  );
  const access = await r.proxy.waitForLog((l) => l.msg === 'access' && l.retries === 2);
  t.equal(access.status, 200, 'the access line counts both retries');
  checkNoLeaks(t);
});

t.test('a streamed upload meeting a rotation is not sent again: 503 token_rejected saying why', async (t) => {
  const r = await rig(t);
  r.mint('tok-cli-rot-3-DDDD');
  const big = Buffer.alloc(200 * 1024, 0x61);
  const put = request(`${r.base}/upload`, { method: 'PUT', body: big, headers: { 'content-type': 'application/octet-stream' } });
  await r.saas.waitForRequests(1);
  r.apply();
  const res = await put;
  const text = await res.body.text();
  assertJsonError(t, { status: res.statusCode, headers: res.headers, body: text, text }, 503, 'token_rejected');
  t.match((JSON.parse(text) as { message: string }).message, /cannot be sent again/);
  t.equal(r.saas.requests.length, 1, 'not sent twice');
});

t.test('a 401 with no rotation is relayed to the CLI as the SaaS sent it, after the bound', async (t) => {
  const r = await rig(t, 200);
  r.mint('tok-cli-never-EEEE');
  const res = await request(`${r.base}/repos`);
  t.equal(res.statusCode, 401);
  t.same(await res.body.json(), { message: 'Bad credentials' });
  t.equal(res.headers['www-authenticate'], 'Bearer');
  t.equal(r.saas.requests.length, 1);
});

// Ten minutes: a request that answers at all was ended by the disconnect, not the bound.
const FOREVER_MS = 600_000;

t.test('a disconnect during the wait ends it at once: token file deleted → 503 token_unavailable, the held 401 dropped', async (t) => {
  const r = await rig(t, FOREVER_MS);
  r.mint('tok-cli-never-FFFF');
  const get = request(`${r.base}/repos`);
  await r.saas.waitForRequests(1);
  rmSync(r.tokenFile);
  const res = await get;
  const text = await res.body.text();
  assertJsonError(t, { status: res.statusCode, headers: res.headers, body: text, text }, 503, 'token_unavailable');
  t.equal(r.saas.requests.length, 1);
});

t.test('the provider removed from the reloaded catalog during the wait: 404 unknown_provider at once', async (t) => {
  const r = await rig(t, FOREVER_MS);
  r.mint('tok-cli-never-GGGG');
  const get = request(`${r.base}/repos`);
  await r.saas.waitForRequests(1);
  await loadConfig(r.proxy, {});
  const res = await get;
  const text = await res.body.text();
  assertJsonError(t, { status: res.statusCode, headers: res.headers, body: text, text }, 404, 'unknown_provider');
  t.equal(r.saas.requests.length, 1);
});
