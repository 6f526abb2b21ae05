import { execFileSync, spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { X509Certificate } from 'node:crypto';
import { connect, createServer, type SecureContext } from 'node:tls';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { createCa, issueLeaf, loadCa, serial } from '../../src/cli-proxy/certificates.js';
import { LeafCache } from '../../src/cli-proxy/leaf-cache.js';
import { tempDir } from '../support/temp-dir.js';

const ca = await createCa('agent-connectors CLI CA', 3650);
const loaded = await loadCa(ca.cert, ca.key);

t.test('the CA: self-signed, CA:TRUE with path length 0, key usage for signing certificates', async (t) => {
  const x = new X509Certificate(ca.cert);
  t.ok(x.ca, 'a CA');
  t.ok(x.verify(x.publicKey), 'self-signed');
  t.equal(x.subject, 'CN=agent-connectors CLI CA');
  t.ok(new Date(x.validTo).getTime() > Date.now() + 3000 * 86_400_000, 'valid for years');
  const other = await createCa('another', 1);
  await t.rejects(loadCa(ca.cert, other.key), /does not match/, 'a key of another CA is refused');
});

t.test('serial numbers are DER\'s shortest positive form: never a leading zero byte, never the sign bit', async (t) => {
  // The bug this guards: one draw in 256 began 0x00 <0x80, and OpenSSL (and Node's
  // X509Certificate) refused that leaf as "illegal padding". 4 096 draws find it all but surely.
  let bad = 0;
  for (let i = 0; i < 4096; i++) {
    const first = new Uint8Array(serial().valueBlock.valueHexView)[0] as number;
    if (first === 0 || first >= 0x80) bad += 1;
  }
  t.equal(bad, 0, 'every first byte in 0x01..0x7f');
});

t.test('a leaf: for exactly one host, short-lived, signed by the CA', async (t) => {
  const leaf = await issueLeaf(loaded, 'api.github.com', 24 * 3_600_000);
  const x = new X509Certificate(leaf.cert);
  t.notOk(x.ca, 'not a CA');
  t.equal(x.subjectAltName, 'DNS:api.github.com', 'one DNS name, no wildcard');
  t.ok(x.checkIssued(new X509Certificate(ca.cert)) && x.verify(new X509Certificate(ca.cert).publicKey), 'issued and signed by the CA');
  const life = new Date(x.validTo).getTime() - Date.now();
  t.ok(life <= 24 * 3_600_000 + 1000 && life > 23 * 3_600_000, 'valid for about a day');
  t.equal(x.checkHost('api.github.com'), 'api.github.com');
  t.equal(x.checkHost('evil.github.com'), undefined);
});

t.test('OpenSSL\'s strict verification (Python 3.13\'s default) accepts the chain', { skip: spawnSync('openssl', ['version']).error ? 'no openssl' : false }, async (t) => {
  const dir = tempDir('ac-leaf-', t);
  const leaf = await issueLeaf(loaded, 's3.amazonaws.com', 3_600_000);
  writeFileSync(join(dir, 'ca.pem'), ca.cert);
  writeFileSync(join(dir, 'leaf.pem'), leaf.cert);
  const out = execFileSync('openssl', ['verify', '-x509_strict', '-purpose', 'sslserver', '-CAfile', join(dir, 'ca.pem'), join(dir, 'leaf.pem')], { encoding: 'utf8' });
  t.match(out, /leaf\.pem: OK/);
});

t.test('a TLS client trusting only the CA completes a handshake for the host', async (t) => {
  const cache = new LeafCache(loaded);
  const context = await cache.context('api.github.com');
  const server = createServer({ SNICallback: (_name, cb) => cb(null, context) }, (s) => s.end('ok'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const port = (server.address() as AddressInfo).port;
  const text = await new Promise<string>((resolve, reject) => {
    const c = connect({ port, host: '127.0.0.1', servername: 'api.github.com', ca: ca.cert }, () => undefined);
    let got = '';
    c.on('data', (d: Buffer) => (got += d.toString()));
    c.on('end', () => resolve(got));
    c.on('error', reject);
  });
  t.equal(text, 'ok');
  const wrong = await new Promise<string>((resolve) => {
    const c = connect({ port, host: '127.0.0.1', servername: 'uploads.github.com', ca: ca.cert });
    c.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
    c.on('secureConnect', () => resolve('connected'));
  });
  t.equal(wrong, 'ERR_TLS_CERT_ALTNAME_INVALID', 'the leaf does not answer for another name');
});

t.test('the cache: one mint per host, shared by concurrent asks, minted again before expiry', async (t) => {
  let now = Date.now();
  const cache = new LeafCache(loaded, { validMs: 10 * 60_000, renewBeforeMs: 60_000, now: () => now });
  const [a, b] = await Promise.all([cache.context('api.github.com'), cache.context('api.github.com')]);
  t.equal(a, b, 'concurrent handshakes share one leaf');
  t.equal(cache.minted, 1);
  t.equal(await cache.context('api.github.com'), a, 'cached');
  await cache.context('uploads.github.com');
  t.equal(cache.minted, 2, 'one per host');
  now += 8 * 60_000;
  t.equal(await cache.context('api.github.com'), a, 'still 2 minutes left: kept');
  now += 90_000;
  const renewed: SecureContext = await cache.context('api.github.com');
  t.not(renewed, a, 'within a minute of its end: minted again');
  t.equal(cache.minted, 3);
});

t.test('the cache is bounded: the least recently used host goes', async (t) => {
  const cache = new LeafCache(loaded, { maxEntries: 2 });
  const first = await cache.context('a.example.com');
  await cache.context('b.example.com');
  await cache.context('a.example.com');
  await cache.context('c.example.com');
  t.equal(cache.size, 2);
  t.equal(await cache.context('a.example.com'), first, 'recently used: kept');
  t.equal(cache.minted, 3, 'b went, a stayed');
});
