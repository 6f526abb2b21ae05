import t from 'tap';
import { checkNoLeaks, startCli, type CliProc } from '../test/support/cli-proc.js';
import type { MockGateway } from '../test/support/mock-gateway.js';
import { within } from '../test/support/poll.js';
import { forwarderRig, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { assertJsonError, RawConnection, rawExchange, send, type Resp } from './helpers/http-raw.js';

const BINDING = 'bind_hardening_01';
const BODY = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}';

interface Setup {
  gw: MockGateway;
  fwd: ProxyProc;
  url: string;
}

const setup = (tt: TapTest, args: string[] = []): Promise<Setup> => forwarderRig(tt, { binding: BINDING, token: 'tok-hardening-RRRR', args });

/** A raw POST to the binding with the given header lines (no Host unless given). */
function rawPost(lines: string[], version = '1.1', body = BODY): string {
  return (
    `POST /i/${BINDING}/mcp HTTP/${version}\r\n` +
    [...lines, 'Content-Type: application/json', `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close'].join('\r\n') +
    `\r\n\r\n${body}`
  );
}

t.test('Host must name this loopback listener (DNS rebinding)', async (t) => {
  const { gw, fwd } = await setup(t);
  const wrongPort = fwd.port === 65535 ? 65534 : fwd.port + 1;
  const refused: Array<[string, string[]]> = [
    ['evil.example:PORT', [`Host: evil.example:${fwd.port}`]],
    ['evil.example without port', ['Host: evil.example']],
    ['127.0.0.1:WRONGPORT', [`Host: 127.0.0.1:${wrongPort}`]],
    ['localhost without port', ['Host: localhost']],
    ['127.0.0.1.evil.example:PORT', [`Host: 127.0.0.1.evil.example:${fwd.port}`]],
    ['localhost.evil.example:PORT', [`Host: localhost.evil.example:${fwd.port}`]],
  ];
  for (const [what, lines] of refused) {
    assertJsonError(t, await rawExchange(fwd.port, rawPost(lines)), 403, 'forbidden_host', what);
  }
  assertJsonError(t, await rawExchange(fwd.port, rawPost([], '1.0')), 403, 'forbidden_host', 'HTTP/1.0 without Host');
  // RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400; either way it is refused.
  const noHost11 = await rawExchange(fwd.port, rawPost([], '1.1'));
  t.ok(noHost11.status === 400 || noHost11.status === 403, `HTTP/1.1 without Host refused (got ${noHost11.status})`);
  t.equal(gw.requests.length, 0, 'upstream never called for a refused Host');

  const accepted = [`localhost:${fwd.port}`, `127.0.0.1:${fwd.port}`, `[::1]:${fwd.port}`, `LOCALHOST:${fwd.port}`];
  for (const host of accepted) {
    const resp = await rawExchange(fwd.port, rawPost([`Host: ${host}`]));
    t.equal(resp.status, 200, `Host ${host} accepted`);
  }
  t.equal(gw.requests.length, accepted.length, 'each accepted request reached the upstream');
});

t.test('Origin, when present, must be loopback', async (t) => {
  const { gw, url } = await setup(t);
  for (const origin of ['http://evil.example', 'https://evil.example:443', 'null', 'not a url', 'http://127.0.0.1.evil.example', 'file://', 'chrome-extension://abcdef']) {
    const resp = await send(url, { headers: { 'content-type': 'application/json', origin }, body: BODY });
    assertJsonError(t, resp, 403, 'forbidden_origin', `Origin ${origin}`);
  }
  t.equal(gw.requests.length, 0, 'upstream never called for a refused Origin');
  const passing = ['http://localhost:3000', 'http://127.0.0.1:9', 'http://[::1]:8080', 'https://localhost'];
  for (const origin of passing) {
    const resp = await send(url, { headers: { 'content-type': 'application/json', origin }, body: BODY });
    t.equal(resp.status, 200, `Origin ${origin} passes`);
  }
  const none = await send(url, { headers: { 'content-type': 'application/json' }, body: BODY });
  t.equal(none.status, 200, 'no Origin passes');
  t.equal(gw.requests.length, passing.length + 1);
  t.notOk(
    gw.requests.some((r) => r.headers.origin !== undefined),
    'the Origin itself is not forwarded',
  );
});

t.test('405 method_not_allowed with Allow; 404 not_found for other paths', async (t) => {
  const { gw, fwd, url } = await setup(t);
  for (const method of ['PUT', 'PATCH']) {
    const resp = await send(url, { method, headers: { 'content-type': 'application/json' }, body: BODY });
    assertJsonError(t, resp, 405, 'method_not_allowed', method);
    const allow = String(resp.headers.allow ?? '');
    t.ok(allow, `${method}: Allow header present`);
    for (const m of ['POST', 'GET', 'DELETE']) t.match(allow, new RegExp(`\\b${m}\\b`), `${method}: Allow lists ${m}`);
    t.notMatch(allow, /\b(PUT|PATCH)\b/, `${method}: Allow does not list ${method}`);
  }
  for (const path of ['/', '/.well-known/oauth-authorization-server', '/.well-known/oauth-protected-resource', `/i/${BINDING}/mcp/extra`, `/i/${BINDING}`, '/i/', '/register', '/authorize']) {
    const resp = await send(`${fwd.base}${path}`, { method: 'GET', headers: {} });
    assertJsonError(t, resp, 404, 'not_found', `GET ${path}`);
  }
  const postRegister = await send(`${fwd.base}/register`, { body: '{"client_name":"x"}' });
  assertJsonError(t, postRegister, 404, 'not_found', 'POST /register (dynamic client registration)');
  t.equal(gw.requests.length, 0, 'upstream never called');
});

t.test('413 payload_too_large: declared and chunked bodies, readable while uploading, keep-alive kept', async (t) => {
  const LIMIT = 65536;
  const { gw, fwd, url } = await setup(t, ['--body-limit-bytes', String(LIMIT)]);

  // At the limit: accepted.
  const atLimit = `{"pad":"${'a'.repeat(LIMIT - 10)}"}`;
  t.equal(Buffer.byteLength(atLimit), LIMIT);
  t.equal((await send(url, { body: atLimit })).status, 200, 'a body of exactly the limit is forwarded');
  t.equal(gw.requests.length, 1);
  t.equal(gw.requests[0]?.body.length, LIMIT);

  // Declared over the limit: the answer comes before the body is complete.
  {
    const conn = await RawConnection.open(fwd.port);
    t.teardown(() => conn.destroy());
    const total = 200_000;
    await conn.write(
      `POST /i/${BINDING}/mcp HTTP/1.1\r\nHost: 127.0.0.1:${fwd.port}\r\nContent-Type: application/json\r\nContent-Length: ${total}\r\n\r\n`,
    );
    await conn.write(Buffer.alloc(1000, 0x61));
    const resp = await conn.readResponse();
    assertJsonError(t, resp, 413, 'payload_too_large', 'Content-Length over the limit');
    // Finish the upload, then reuse the socket.
    let sent = 1000;
    while (sent < total) {
      const n = Math.min(16_384, total - sent);
      await conn.write(Buffer.alloc(n, 0x61));
      sent += n;
    }
    await conn.write(`GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:${fwd.port}\r\n\r\n`);
    const second = await conn.readResponse();
    t.equal(second.status, 200, 'the same socket serves the next request');
    t.match(second.body, /"status"/);
    conn.destroy();
  }

  // Chunked over the limit, uploaded on while the answer is read.
  {
    const conn = await RawConnection.open(fwd.port);
    t.teardown(() => conn.destroy());
    await conn.write(
      `POST /i/${BINDING}/mcp HTTP/1.1\r\nHost: 127.0.0.1:${fwd.port}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`,
    );
    const chunk = Buffer.concat([Buffer.from('2000\r\n'), Buffer.alloc(0x2000, 0x62), Buffer.from('\r\n')]);
    let uploaded = 0;
    const deadline = Date.now() + 10_000;
    // Keep uploading until the whole 413 answer has been read; never stop to wait for it.
    while (!conn.hasResponse()) {
      if (Date.now() > deadline || conn.closed) break;
      await conn.write(chunk);
      uploaded += 0x2000;
      if (uploaded > LIMIT) await new Promise((r) => setTimeout(r, 2));
    }
    t.ok(conn.hasResponse(), `the 413 arrived while uploading (after ${uploaded} bytes)`);
    t.notOk(conn.closed, 'the connection is still open');
    const resp = await conn.readResponse();
    assertJsonError(t, resp, 413, 'payload_too_large', 'chunked over the limit');
    for (let i = 0; i < 8; i++) await conn.write(chunk);
    await conn.write('0\r\n\r\n');
    await conn.write(
      `POST /i/${BINDING}/mcp HTTP/1.1\r\nHost: 127.0.0.1:${fwd.port}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BODY)}\r\n\r\n${BODY}`,
    );
    const second = await conn.readResponse();
    t.equal(second.status, 200, 'after the chunked body ends, the same socket serves a forwarded request');
    t.equal(gw.requests.length, 2, 'only that small request reached the upstream');
    t.equal(gw.requests[1]?.body.toString(), BODY, 'and it arrived intact (the connection was parsed in step)');
    conn.destroy();
  }

  // Through an ordinary client too.
  const big = await send(url, { body: 'x'.repeat(LIMIT + 1) });
  assertJsonError(t, big, 413, 'payload_too_large', 'client library, one byte over');
  t.equal(gw.requests.length, 2, 'upstream never called for a 413');
});

t.test('oversized request headers: 431, and the process keeps serving', async (t) => {
  const { gw, fwd, url } = await setup(t);
  const resp = await rawExchange(
    fwd.port,
    `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:${fwd.port}\r\nX-Big: ${'h'.repeat(40 * 1024)}\r\n\r\n`,
  ).catch((err: Error) => err);
  if (resp instanceof Error) t.fail(`no answer to oversized headers: ${resp.message}`);
  else t.equal(resp.status, 431, '431 Request Header Fields Too Large');
  const big = await rawExchange(fwd.port, rawPost([`Host: 127.0.0.1:${fwd.port}`, `X-Big: ${'h'.repeat(40 * 1024)}`])).catch((err: Error) => err);
  t.ok(big instanceof Error || big.status === 431, 'an oversized POST to a binding is refused too');
  t.equal(gw.requests.length, 0, 'upstream never called');
  t.equal(fwd.child.exitCode, null, 'the process is still running');
  const h = await send(`${fwd.base}/healthz`, { method: 'GET', headers: {} });
  t.equal(h.status, 200, 'and keeps serving');
  t.equal((await send(url, { body: BODY })).status, 200);
});

/** Waits for a CLI process to exit, failing (and killing it) if it does not within the deadline. */
async function exitOf(t: TapTest, proc: CliProc, what: string): Promise<number | null> {
  await within(proc.exited, 10_000, `${what} exits`).catch((err: Error) => {
    t.fail(err.message);
    proc.child.kill('SIGKILL');
  });
  return (await proc.exited).code;
}

t.test('CLI: a non-loopback --listen is refused at startup; usage errors exit 2; --help exits 0', async (t) => {
  const stateDir = tempDir('ac-test-', t);
  for (const listen of ['0.0.0.0:0', '192.168.1.1:0', '[::]:0', '10.0.0.1:0']) {
    const proc = startCli(['forwarder', '--listen', listen, '--state-dir', stateDir]);
    const code = await exitOf(t, proc, `--listen ${listen}`);
    t.equal(code, 2, `--listen ${listen}: exit 2`);
    t.match(proc.stderr.join('\n'), /loopback/i, `--listen ${listen}: stderr names loopback`);
    t.notOk(proc.logs.some((l) => l.msg === 'forwarder listening'), `--listen ${listen}: never listened`);
  }
  const unknown = startCli(['forwarder', '--no-such-option', '--state-dir', stateDir]);
  t.equal(await exitOf(t, unknown, 'unknown option'), 2, 'unknown option: exit 2');
  t.match(unknown.stderr.join('\n'), /no-such-option|unknown option/i, 'unknown option: stderr says so');
  const help = startCli(['forwarder', '--help']);
  t.equal(await exitOf(t, help, '--help'), 0, '--help: exit 0');
  t.match(help.lines.join('\n'), /--listen/, '--help documents --listen');
  const badLimit = startCli(['forwarder', '--listen', '127.0.0.1:0', '--state-dir', stateDir, '--body-limit-bytes', 'lots']);
  t.equal(await exitOf(t, badLimit, 'bad --body-limit-bytes'), 2, 'an invalid option value: exit 2');
});

t.test('every error answer has the same JSON shape', async (t) => {
  const { fwd, url } = await setup(t);
  const cases: Array<[string, Promise<Resp>, number, string]> = [
    ['not_found', send(`${fwd.base}/nope`, { method: 'GET', headers: {} }), 404, 'not_found'],
    ['unknown_binding', send(`${fwd.base}/i/bind_unknown_000/mcp`), 404, 'unknown_binding'],
    ['method_not_allowed', send(url, { method: 'PUT' }), 405, 'method_not_allowed'],
    ['forbidden_origin', send(url, { headers: { origin: 'http://evil.example', 'content-type': 'application/json' } }), 403, 'forbidden_origin'],
    ['forbidden_host', rawExchange(fwd.port, rawPost([`Host: evil.example:${fwd.port}`])), 403, 'forbidden_host'],
    ['healthz POST', send(`${fwd.base}/healthz`), 405, 'method_not_allowed'],
  ];
  for (const [what, p, status, code] of cases) assertJsonError(t, await p, status, code, what);
});

t.test('ids named like Object.prototype members are unknown bindings, not lookups of inherited properties', async (t) => {
  const { gw, fwd } = await setup(t);
  for (const id of ['constructor', 'hasOwnProperty', '__proto__', 'toString', 'valueOf_']) {
    const res = await send(`${fwd.base}/i/${id}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: BODY });
    assertJsonError(t, res, 404, 'unknown_binding', id);
  }
  t.equal(gw.requests.length, 0, 'upstream never called');
});

checkNoLeaks(t);
