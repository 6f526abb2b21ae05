import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { request } from 'undici';
import { RenewAuthority } from '../../src/dev/demo-gateway/authority.js';
import { handleRenewHttp } from '../../src/dev/demo-gateway/gateway-http.js';
import {
  cliSlot,
  instanceSlot,
  matchRenewPath,
  parseSlotId,
  renewConflictSchema,
  renewOkSchema,
  renewPath,
  renewRequestSchema,
  renewUrl,
  slotIdSchema,
} from '../../src/data/renew-wire.js';

t.test('slot ids', async (t) => {
  for (const good of ['instance:a', 'cli:notion', 'instance:A-b_c.9', `instance:${'x'.repeat(128)}`, 'instance:..']) {
    t.ok(slotIdSchema.safeParse(good).success, good);
  }
  for (const bad of ['instance:', 'cli:', 'instance', 'other:a', 'Instance:a', 'instance:a/b', 'instance:a b', 'instance:a:b', 'instance:é', `cli:${'x'.repeat(129)}`, ' cli:a', 'cli:a\n']) {
    t.notOk(slotIdSchema.safeParse(bad).success, JSON.stringify(bad));
  }
  t.same(parseSlotId('cli:notion'), { kind: 'cli', id: 'notion' });
  t.equal(parseSlotId('cli:no/tion'), undefined);
  t.equal(instanceSlot('abc'), 'instance:abc');
  t.equal(cliSlot('gh'), 'cli:gh');
  t.throws(() => instanceSlot('a/b'));
});

t.test('renewPath percent-encodes the colon; matchRenewPath accepts both forms', async (t) => {
  t.equal(renewPath('instance:abc'), '/v1/host/credentials/instance%3Aabc/renew');
  t.equal(renewPath('cli:my.tool'), '/v1/host/credentials/cli%3Amy.tool/renew');
  t.throws(() => renewPath('instance:a/b'));
  t.equal(renewUrl('https://gw.example/', 'cli:x').href, 'https://gw.example/v1/host/credentials/cli%3Ax/renew');
  t.equal(renewUrl('https://gw.example/base/', 'cli:x').href, 'https://gw.example/base/v1/host/credentials/cli%3Ax/renew');
  t.same(matchRenewPath('/v1/host/credentials/instance%3Aabc/renew'), { ok: true, slot: 'instance:abc' });
  t.same(matchRenewPath('/v1/host/credentials/instance%3aabc/renew'), { ok: true, slot: 'instance:abc' });
  t.same(matchRenewPath('/v1/host/credentials/instance:abc/renew'), { ok: true, slot: 'instance:abc' });
  t.same(matchRenewPath('/v1/host/credentials/instance%3Aa%2Fb/renew'), { ok: false });
  t.same(matchRenewPath('/v1/host/credentials/%ZZ/renew'), { ok: false });
  t.same(matchRenewPath('/v1/host/credentials/abc/renew'), { ok: false });
  t.equal(matchRenewPath('/v1/host/credentials//renew'), undefined);
  t.equal(matchRenewPath('/v1/host/credentials/a/b/renew'), undefined);
  t.equal(matchRenewPath('/v1/host/credentials/instance:abc/renew/'), undefined);
  t.equal(matchRenewPath('/mcp'), undefined);
});

t.test('request and answer schemas', async (t) => {
  const id = randomUUID();
  t.ok(renewRequestSchema.safeParse({ requestId: id, expectedTokenId: null }).success);
  t.ok(renewRequestSchema.safeParse({ requestId: id, expectedTokenId: 'tid_1' }).success);
  t.notOk(renewRequestSchema.safeParse({ requestId: id }).success, 'expectedTokenId is required');
  t.notOk(renewRequestSchema.safeParse({ requestId: 'x', expectedTokenId: null }).success);
  t.notOk(renewRequestSchema.safeParse({ requestId: id, expectedTokenId: '' }).success);
  t.notOk(renewRequestSchema.safeParse({ requestId: id, expectedTokenId: null, more: 1 }).success, 'strict');

  const good = { slot: 'cli:x', tokenId: 'tid_1', token: 'abc.DEF-_~+/=', expiresAt: '2030-01-01T00:00:00Z', credentialGeneration: 0 };
  t.ok(renewOkSchema.safeParse(good).success);
  t.ok(renewOkSchema.safeParse({ ...good, expiresAt: '2030-01-01T00:00:00.123+02:00' }).success, 'offset');
  t.same(renewOkSchema.parse({ ...good, extra: true }), good, 'extra fields stripped');
  for (const [k, v] of [
    ['expiresAt', '2030-01-01T00:00:00'],
    ['expiresAt', '2030-01-01'],
    ['expiresAt', 1893456000000],
    ['credentialGeneration', -1],
    ['credentialGeneration', 1.5],
    ['token', ''],
    ['token', 'a b'],
    ['token', 'a\nb'],
    ['token', 'x'.repeat(16 * 1024 + 1)],
    ['tokenId', ''],
    ['slot', 'instance:a/b'],
  ] as const) {
    t.notOk(renewOkSchema.safeParse({ ...good, [k]: v }).success, `${k}=${String(v).slice(0, 30)}`);
  }
  t.ok(renewOkSchema.safeParse({ ...good, token: 'x'.repeat(16 * 1024) }).success, '16 KiB token');
  t.ok(renewConflictSchema.safeParse({ error: 'token_conflict', currentTokenId: null }).success);
  t.notOk(renewConflictSchema.safeParse({ error: 'other', currentTokenId: 'a' }).success);
});

t.test('handleRenewHttp: handles its path, leaves others to the caller', async (t) => {
  const authority = new RenewAuthority({ credential: 'c', tokenLifetimeMs: 1000, slots: ['cli:x'] });
  const server = createServer((req, res) => {
    void handleRenewHttp(authority, req, res).then((handled) => {
      if (!handled) {
        res.writeHead(418);
        res.end('elsewhere');
      }
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const other = await request(`${base}/mcp`);
  t.equal(other.statusCode, 418);
  t.equal(await other.body.text(), 'elsewhere');
  const res = await request(`${base}${renewPath('cli:x')}`, {
    method: 'POST',
    headers: { authorization: 'bearer c', 'content-type': 'application/json' },
    body: JSON.stringify({ requestId: randomUUID(), expectedTokenId: null }),
  });
  t.equal(res.statusCode, 200, 'scheme is case-insensitive');
  t.equal(res.headers['cache-control'], 'no-store');
  t.equal(renewOkSchema.parse(await res.body.json()).slot, 'cli:x');
});
