import { EventEmitter, once } from 'node:events';
import { renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import t from 'tap';
import { checkNoLeaks, writeToken } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { loadConfig, startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { assertJsonError, RawConnection, send } from './helpers/http-raw.js';

/**
 * SPEC §4: the Gateway honours only a slot's current token, so a renewal opens a window
 * in which the token file still holds a token the Gateway already refuses. The forwarder
 * bridges it: an upstream 401 waits (bounded) for the file to change, then retries once.
 * The Gateway here is strict: it accepts exactly the token the test last rotated in.
 */

const BINDING = 'bind_rotation_test_01';
const RPC = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{}}}';
const OK = '{"jsonrpc":"2.0","id":7,"result":{"content":[]}}';

interface Rig {
  gw: MockGateway;
  fwd: ProxyProc;
  url: string;
  /** The token the strict Gateway accepts now. */
  current: () => string;
  /** A renewal: the Gateway honours the new token at once; the file follows later. */
  mint: (token: string) => void;
  /** apply writing the minted token (or an older one, late) into place. */
  apply: (token?: string) => void;
  tokenFile: string;
}

async function rig(t: TapTest, waitMs?: number): Promise<Rig> {
  const gw = await MockGateway.start();
  t.teardown(() => gw.close());
  const fwd = await startProxy(t, 'forwarder', { args: waitMs === undefined ? [] : ['--token-wait-ms', String(waitMs)] });
  const tokenFile = join(fwd.dir, 'inst-rot.token');
  let accepted = 'tok-rotation-0-AAAA';
  writeToken(tokenFile, accepted);
  await loadConfig(fwd, { [BINDING]: { instanceId: 'inst-rot', upstreamUrl: gw.url(), tokenFile } });
  gw.handle((req, res) => {
    if (req.headers.authorization !== `Bearer ${accepted}`) return json(res, 401, { error: 'invalid_token' });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(OK) });
    res.end(OK);
  });
  return {
    gw,
    fwd,
    url: `${fwd.base}/i/${BINDING}/mcp`,
    current: () => accepted,
    mint: (token) => {
      accepted = token;
    },
    // As renew apply does it: a complete file renamed into place.
    apply: (token = accepted) => {
      writeToken(`${tokenFile}.new`, token);
      renameSync(`${tokenFile}.new`, tokenFile);
    },
    tokenFile,
  };
}

t.test('a 401 during a rotation waits for the new token file and retries once: the agent sees 200', async (t) => {
  const r = await rig(t);
  r.mint('tok-rotation-1-BBBB');
  // The Gateway has refused the old token before apply writes the new one.
  const pending = send(r.url, { body: RPC });
  await r.gw.waitForRequests(1);
  r.apply();
  const resp = await pending;
  t.equal(resp.status, 200);
  t.equal(resp.body, OK);
  t.equal(r.gw.requests.length, 2, 'the original request and one retry');
  t.equal(r.gw.requests[0]?.headers.authorization, 'Bearer tok-rotation-0-AAAA');
  t.equal(r.gw.requests[1]?.headers.authorization, 'Bearer tok-rotation-1-BBBB');
  t.equal(r.gw.requests[1]?.body.toString(), RPC, 'the retry carries the same body');
  const access = await r.fwd.waitForLog((l) => l.msg === 'access' && l.retried === true);
  t.equal(access.status, 200, 'the access line says it was retried and answered 200');
  checkNoLeaks(t);
});

t.test('a retry that meets the next rotation waits for that one too: the agent sees 200', async (t) => {
  const r = await rig(t);
  // A loaded machine, held at the exact moment: renewals every ~400 ms (renew-e2e) and a
  // mint → rename window that reached ~400 ms at load 13, so the retry's token had been
  // superseded by the next renewal before the retry reached the Gateway.
  r.mint('tok-rotation-1-IIII');
  const pending = send(r.url, { body: RPC });
  await r.gw.waitForRequests(1);
  r.mint('tok-rotation-2-JJJJ');
  r.apply('tok-rotation-1-IIII');
  await r.gw.waitForRequests(2);
  r.apply();
  const resp = await pending;
  t.equal(resp.status, 200, `the agent sees 200 (${resp.body.slice(0, 120)})`);
  t.equal(resp.body, OK);
  t.same(
    r.gw.requests.map((q) => q.headers.authorization),
    ['Bearer tok-rotation-0-AAAA', 'Bearer tok-rotation-1-IIII', 'Bearer tok-rotation-2-JJJJ'],
    'the request, a retry with the superseded renewal, a retry with the current one',
  );
  const access = await r.fwd.waitForLog((l) => l.msg === 'access' && l.retried === true);
  t.equal(access.status, 200);
  t.equal(access.retries, 2, 'the access line counts both retries');
});

t.test('a retry refused with a token that then stays: 503 token_rejected within the one bound', async (t) => {
  const r = await rig(t, 300);
  r.mint('tok-rotation-1-KKKK');
  const pending = send(r.url, { body: RPC });
  await r.gw.waitForRequests(1);
  r.mint('tok-rotation-never-applied-LLLL');
  r.apply('tok-rotation-1-KKKK');
  assertJsonError(t, await pending, 503, 'token_rejected');
  t.equal(r.gw.requests.length, 2, 'the request and one retry: the file never changed again');
  const access = await r.fwd.waitForLog((l) => l.msg === 'access' && l.status === 503);
  t.equal(access.retries, 1);
});

t.test('no rotation: the 401 waits out the bound, then 503 token_rejected; one upstream request', async (t) => {
  const r = await rig(t, 300);
  r.mint('tok-rotation-never-applied-CCCC');
  const resp = await send(r.url, { body: RPC });
  assertJsonError(t, resp, 503, 'token_rejected');
  t.equal(r.gw.requests.length, 1, 'no retry: the token never changed');
});

t.test('--token-wait-ms 0 answers at once without waiting', async (t) => {
  const r = await rig(t, 0);
  r.mint('tok-rotation-never-DDDD');
  const resp = await send(r.url, { body: RPC });
  assertJsonError(t, resp, 503, 'token_rejected');
  t.equal(r.gw.requests.length, 1);
});

t.test('an agent that leaves during the wait: no retry is sent for it', async (t) => {
  const r = await rig(t, 60_000);
  r.mint('tok-rotation-2-EEEE');
  const conn = await RawConnection.open(r.fwd.port);
  t.teardown(() => conn.destroy());
  await conn.write(
    `POST /i/${BINDING}/mcp HTTP/1.1\r\nHost: 127.0.0.1:${r.fwd.port}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: ${Buffer.byteLength(RPC)}\r\n\r\n${RPC}`,
  );
  await r.gw.waitForRequests(1);
  conn.destroy();
  const access = await r.fwd.waitForLog((l) => l.msg === 'access' && l.outcome === 'client_closed');
  t.equal(access.upstreamStatus, 401);
  r.apply();
  // A later request proves the forwarder moved on; the left one never produced a retry.
  const resp = await send(r.url, { body: RPC });
  t.equal(resp.status, 200);
  t.equal(r.gw.requests.length, 2, 'the left request (401) and the later one, no retry in between');
  t.equal(r.gw.requests[1]?.headers.authorization, 'Bearer tok-rotation-2-EEEE');
});

// The bound is ten minutes: a request that answers at all (the test times out long
// before) was ended by the disconnect, not by the bound.
const FOREVER_MS = 600_000;

t.test('a disconnect during the wait ends it at once: token file deleted → 503 token_unavailable, not a retry', async (t) => {
  const r = await rig(t, FOREVER_MS);
  r.mint('tok-rotation-never-GGGG');
  const pending = send(r.url, { body: RPC });
  await r.gw.waitForRequests(1);
  rmSync(r.tokenFile);
  const resp = await pending;
  assertJsonError(t, resp, 503, 'token_unavailable');
  t.equal(r.gw.requests.length, 1, 'nothing sent after the 401');
  const access = await r.fwd.waitForLog((l) => l.msg === 'access' && l.status === 503);
  t.equal(access.tokenProblem, 'missing');
  t.equal(access.upstreamStatus, 401);
});

t.test('the binding removed from the reloaded registry during the wait: 404 unknown_binding at once', async (t) => {
  const r = await rig(t, FOREVER_MS);
  r.mint('tok-rotation-never-HHHH');
  const pending = send(r.url, { body: RPC });
  await r.gw.waitForRequests(1);
  // The token file stays: only the reload tells the waiting request its route is gone.
  await loadConfig(r.fwd, {});
  assertJsonError(t, await pending, 404, 'unknown_binding');
  t.equal(r.gw.requests.length, 1);
});

t.test('concurrent requests across rotations against the strict Gateway: none fails', async (t) => {
  const r = await rig(t);
  const CLIENTS = 8;
  const ROTATIONS = 10;
  let stop = false;
  let failures = 0;
  let done = 0;
  // Rotations come minutes apart on a host, never two inside one request. So each client
  // reports which rotation its last completed request started in, and the next rotation
  // waits until every client has finished one request started after the previous one.
  let round = 0;
  const finishedRound = new Array<number>(CLIENTS).fill(-1);
  const progress = new EventEmitter();
  const clients = Array.from({ length: CLIENTS }, async (_v, c) => {
    while (!stop) {
      const startedIn = round;
      const res = await request(r.url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: RPC,
      });
      await res.body.text();
      if (res.statusCode !== 200) failures += 1;
      done += 1;
      finishedRound[c] = startedIn;
      progress.emit('done');
    }
  });
  const everyClientFinishedIn = async (n: number): Promise<void> => {
    while (!finishedRound.every((f) => f >= n)) await once(progress, 'done');
  };
  for (let i = 1; i <= ROTATIONS; i++) {
    await everyClientFinishedIn(round);
    // Mint, and apply only once the Gateway has refused a request with the old token:
    // every rotation is met by requests inside its window.
    r.mint(`tok-rotation-load-${i}-FFFF`);
    await r.gw.waitForRequests(r.gw.requests.length + 1);
    r.apply();
    round = i;
  }
  await everyClientFinishedIn(round);
  stop = true;
  await Promise.all(clients);
  t.equal(failures, 0, `0 failed of ${done} requests across ${ROTATIONS} rotations`);
  // Each agent request is one upstream request, or two when it met a rotation.
  t.ok(r.gw.requests.length - done >= ROTATIONS, `every rotation was met by a refused request that was retried (${r.gw.requests.length - done} retries)`);
});
