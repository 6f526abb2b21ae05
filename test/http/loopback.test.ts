import t from 'tap';
import { ConfigError } from '../../src/errors.js';
import { checkHost, checkOrigin, parseListen } from '../../src/http/loopback.js';
import { isLoopbackAddress } from '../../src/net/loopback-address.js';

t.test('isLoopbackAddress', async (t) => {
  for (const a of ['127.0.0.1', '127.0.0.2', '127.255.255.254', '127.1.2.3', '::1', '[::1]', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1', '::FFFF:127.9.9.9']) {
    t.ok(isLoopbackAddress(a), `${a} is loopback`);
  }
  for (const a of [
    '0.0.0.0',
    '::',
    '[::]',
    '128.0.0.1',
    '126.255.255.255',
    '10.0.0.1',
    '192.168.1.10',
    '1.2.3.4',
    '::ffff:10.0.0.1',
    '::2',
    'fe80::1',
    'localhost',
    '127.0.0.1.evil.example',
    '',
    '127.0.0.1:80',
    '127.0.0.256',
  ]) {
    t.notOk(isLoopbackAddress(a), `${a} is not loopback`);
  }
});

t.test('parseListen accepts loopback HOST:PORT', async (t) => {
  t.strictSame(parseListen('127.0.0.1:0'), { host: '127.0.0.1', port: 0 });
  t.strictSame(parseListen('127.0.0.1:14323'), { host: '127.0.0.1', port: 14323 });
  t.strictSame(parseListen('127.0.0.5:65535'), { host: '127.0.0.5', port: 65535 });
  t.strictSame(parseListen('[::1]:8080'), { host: '::1', port: 8080 });
  t.strictSame(parseListen('localhost:1'), { host: '127.0.0.1', port: 1 });
  t.strictSame(parseListen('LocalHost:1'), { host: '127.0.0.1', port: 1 });
});

t.test('parseListen refuses non-loopback and bad syntax with ConfigError', async (t) => {
  for (const v of [
    '0.0.0.0:14323',
    '[::]:14323',
    '::',
    '192.168.1.10:14323',
    '10.0.0.1:80',
    '1.2.3.4:80',
    'example.com:80',
    '127.0.0.1.evil.example:80',
    '127.0.0.1',
    '127.0.0.1:',
    ':14323',
    '14323',
    '',
    'localhost',
    '127.0.0.1:99999',
    '127.0.0.1:65536',
    '127.0.0.1:-1',
    '127.0.0.1:abc',
    '127.0.0.1:80:80',
    '::1:8080',
    '[::1]',
    '[::1:8080',
    'http://127.0.0.1:80',
  ]) {
    t.throws(() => parseListen(v), ConfigError, `refuses "${v}"`);
  }
});

t.test('parseListen error is a ConfigError instance (maps to exit 2)', async (t) => {
  let caught: unknown;
  try {
    parseListen('0.0.0.0:1');
  } catch (err) {
    caught = err;
  }
  t.ok(caught instanceof ConfigError);
  t.match((caught as Error).message, /loopback/);
});

t.test('checkHost accepts loopback names with the exact port', async (t) => {
  for (const h of ['127.0.0.1:8080', 'localhost:8080', 'LOCALHOST:8080', 'LocalHost:8080', '[::1]:8080']) {
    t.same(checkHost(h, 8080), { ok: true }, h);
  }
  t.same(checkHost('127.0.0.1', 80), { ok: true }, 'no port means 80');
  t.same(checkHost('localhost', 80), { ok: true }, 'no port means 80');
  t.same(checkHost('[::1]', 80), { ok: true }, 'no port means 80');
});

t.test('checkHost refuses a wrong or missing port', async (t) => {
  t.equal(checkHost('127.0.0.1:8081', 8080).ok, false);
  t.equal(checkHost('localhost:80', 8080).ok, false);
  t.equal(checkHost('127.0.0.1', 8080).ok, false, 'no port means 80, not the listener port');
  t.equal(checkHost('[::1]', 8080).ok, false);
  t.equal(checkHost('127.0.0.1:0', 8080).ok, false);
  t.equal(checkHost('127.0.0.1:443', 443).ok, true);
});

t.test('checkHost refuses non-loopback and other loopback-looking names', async (t) => {
  for (const h of [
    'evil.example:8080',
    '127.0.0.1.evil.example:8080',
    'localhost.evil.example:8080',
    'localhost.:8080',
    '127.0.0.2:8080',
    '0.0.0.0:8080',
    '[::]:8080',
    '192.168.1.10:8080',
    '2130706433:8080',
    '0x7f000001:8080',
  ]) {
    const r = checkHost(h, 8080);
    t.equal(r.ok, false, `refuses ${h}`);
    if (!r.ok) t.type(r.reason, 'string');
  }
});

t.test('checkHost refuses missing and garbage Host', async (t) => {
  for (const h of [undefined, '', ':8080', '127.0.0.1:', '127.0.0.1:80:80', '[::1', '::1:8080', '127.0.0.1:8080/x', 'a b:8080', '127.0.0.1:808080']) {
    t.equal(checkHost(h, 8080).ok, false, `refuses ${JSON.stringify(h)}`);
  }
});

t.test('checkOrigin: a missing Origin passes', async (t) => {
  t.same(checkOrigin(undefined), { ok: true });
});

t.test('checkOrigin: loopback http(s) origins on any port pass', async (t) => {
  for (const o of [
    'http://127.0.0.1',
    'http://127.0.0.1:14323',
    'https://127.0.0.1:8443',
    'http://localhost',
    'http://localhost:3000',
    'HTTP://LOCALHOST:3000',
    'https://localhost:1',
    'http://[::1]',
    'http://[::1]:9',
    'http://127.5.6.7:1',
  ]) {
    t.same(checkOrigin(o), { ok: true }, o);
  }
});

t.test('checkOrigin refuses null, unparseable, other schemes and non-loopback hosts', async (t) => {
  for (const o of [
    'null',
    '',
    'garbage',
    'http://',
    '127.0.0.1:14323',
    'localhost:3000',
    'file:///etc/passwd',
    'file://localhost/x',
    'ws://localhost:3000',
    'wss://127.0.0.1',
    'chrome-extension://abcdef',
    'https://evil.example',
    'http://evil.example:14323',
    'http://127.0.0.1.evil.example',
    'http://localhost.evil.example',
    'http://0.0.0.0',
    'http://[::]',
    'http://192.168.1.10',
  ]) {
    const r = checkOrigin(o);
    t.equal(r.ok, false, `refuses ${JSON.stringify(o)}`);
    if (!r.ok) t.type(r.reason, 'string');
  }
});

t.test('checkHost answers the same whether or not the Host repeats', async (t) => {
  const cases: Array<[string | undefined, number, boolean]> = [
    ['127.0.0.1:8080', 8080, true],
    ['127.0.0.1:8080', 8080, true],
    ['127.0.0.1:8080', 9090, false],
    ['127.0.0.1:8080', 8080, true],
    ['evil.example:8080', 8080, false],
    ['evil.example:8080', 8080, false],
    [undefined, 8080, false],
    ['localhost:9090', 9090, true],
    ['LOCALHOST:9090', 9090, true],
    ['[::1]:9090', 9090, true],
    ['[::1]:9090', 8080, false],
  ];
  for (const [host, port, ok] of cases) t.equal(checkHost(host, port).ok, ok, `${host} on ${port}`);
});
