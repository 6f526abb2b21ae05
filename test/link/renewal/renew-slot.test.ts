import { once } from 'node:events';
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { DEFAULT_TEST_CREDENTIAL, MockRenewGateway } from '../../support/mock-renew-gateway.js';
import { expectationFor, renewSlot, type RenewDeps } from '../../../src/link/renewal/renew-slot.js';
import { hostCredential } from '../../support/host-credential.js';
import { RenewalState, renewalSlotStateSchema, type RenewalSlotState } from '../../../src/link/renewal/renewal-state.js';
import { emptySlotFile, handoffPaths, inboxBatchSchema, inboxFileSchema, isBatchFileName, type HandoffPaths, type SlotFile } from '../../../src/data/handoff.js';
import { InboxBatcher } from '../../../src/link/renewal/inbox-batcher.js';
import { renewOkSchema, type RenewOk } from '../../../src/data/renew-wire.js';
import { memoryLogger } from '../../support/memory-log.js';
import type { TapTest } from '../../support/tap.js';
import { tempDir } from '../../support/temp-dir.js';

const SLOT = 'instance:inst-1';
const NOW = Date.UTC(2030, 0, 1, 12, 0, 0);
const CRED = DEFAULT_TEST_CREDENTIAL;

interface Env {
  root: string;
  p: HandoffPaths;
  state: RenewalState;
  stateDir: string;
  deps: RenewDeps;
  lines: string[];
}

async function env(t: TapTest, gatewayUrl: string): Promise<Env> {
  const root = tempDir('ac-fetch-', t);
  const stateDir = join(root, 'fetch-state');
  const state = new RenewalState(stateDir);
  await state.init();
  const p = handoffPaths(join(root, 'handoff'));
  const { log, lines } = memoryLogger();
  const credential = hostCredential(t, join(root, 'host-credential'), gatewayUrl, log);
  return { root, p, state, stateDir, lines, deps: { paths: p, state, inbox: new InboxBatcher({ dir: p.inbox, now: () => NOW }), credential, log, now: () => NOW } };
}

async function gateway(t: TapTest, slots: string[] = [SLOT]): Promise<MockRenewGateway> {
  const gw = await MockRenewGateway.start({ slots, now: () => NOW });
  t.teardown(() => gw.close());
  return gw;
}

/** fetch's private record for a slot, straight from disk (undefined if absent). */
function stateOnDisk(e: Env, slot = SLOT): RenewalSlotState | undefined {
  const record = RenewalState.readRecords(e.stateDir).get(slot);
  return record === undefined ? undefined : renewalSlotStateSchema.parse(record);
}

/** The ledger's files (its logs and snapshot): the link's private state on disk. */
function ledgerFiles(e: Env): string[] {
  return readdirSync(e.stateDir).filter((n) => !n.startsWith('.')).map((n) => join(e.stateDir, n));
}

/** The newest batch file holding an entry for `slot` (names sort in write order). */
function inboxPath(e: Env, slot = SLOT): string {
  const names = inboxNames(e).filter(isBatchFileName).sort().reverse();
  for (const name of names) if (entriesOf(e, name).some((x) => x.slot === slot)) return join(e.p.inbox, name);
  throw new Error(`no batch holds ${slot}`);
}

function entriesOf(e: Env, name: string): Array<{ slot: string }> {
  const batch = inboxBatchSchema.parse(JSON.parse(readFileSync(join(e.p.inbox, name), 'utf8')));
  return batch.entries.map((x) => inboxFileSchema.parse(x));
}

/** The JSON text of the newest inbox entry for `slot`. */
function inboxText(e: Env, slot = SLOT): string {
  const entries = entriesOf(e, inboxPath(e, slot).slice(e.p.inbox.length + 1)).filter((x) => x.slot === slot);
  return JSON.stringify(entries[entries.length - 1]);
}

function inboxNames(e: Env): string[] {
  return existsSync(e.p.inbox) ? readdirSync(e.p.inbox).filter((n) => !n.startsWith('.')) : [];
}

function noSecretsLogged(t: TapTest, e: Env, secrets: string[]): void {
  for (const line of e.lines) for (const s of secrets) if (line.includes(s)) t.fail(`a log line carries a secret: ${line}`);
}

t.test('the pending requestId is on disk before the request reaches the Gateway', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  gw.inject({ kind: 'hang', commit: true });
  const giveUp = new AbortController();
  const first = renewSlot({ ...e.deps, signal: giveUp.signal }, emptySlotFile(SLOT), CRED);
  const rec = await gw.waitForRequests(1);
  // The Gateway holds the request (and has committed a token): read fetch's state now.
  const onDisk = stateOnDisk(e);
  t.ok(onDisk?.pending, 'a pending renewal is recorded');
  t.equal(onDisk?.pending?.requestId, rec.requestId, 'the very requestId the Gateway received');
  t.equal(onDisk?.pending?.expectedTokenId, null, 'expecting no token for a fresh slot');
  t.equal(onDisk?.pending?.since, new Date(NOW).toISOString());
  t.equal(rec.expectedTokenId, null);
  t.equal(rec.authorization, true);
  t.equal(gw.minted(SLOT), 1, 'the Gateway minted, but the answer never comes');
  t.ok(ledgerFiles(e).length > 0, 'the ledger is on disk');
  for (const f of ledgerFiles(e)) t.equal(statSync(f).mode & 0o777, 0o600, 'private state is 0600');

  // The answer is lost (here: the client gives up). The retry must not mint a second token.
  giveUp.abort();
  const lost = await first;
  t.equal(lost.kind, 'retry');
  t.equal(stateOnDisk(e)?.pending?.requestId, rec.requestId, 'pending kept after a lost answer');
  t.strictSame(inboxNames(e), [], 'nothing delivered yet');

  const second = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(second.kind, 'renewed');
  t.equal(gw.requests[1]?.requestId, rec.requestId, 'the retry reused the requestId');
  t.equal(gw.minted(SLOT), 1, 'still exactly one token minted');
  const delivered = renewOkSchema.parse(JSON.parse(inboxText(e)));
  t.ok(gw.authority.isValidToken(delivered.token), 'the delivered token is the one minted');
});

t.test('200: inbox file 0640 with the body, pending cleared, delivered recorded', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  const out = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  const gwState = gw.authority.slotState(SLOT);
  t.strictSame(out, { kind: 'renewed', tokenId: gwState?.tokenId, expiresAt: gwState?.expiresAt });
  t.equal(statSync(inboxPath(e)).mode & 0o777, 0o640, 'inbox file 0640');
  const text = inboxText(e);
  const inbox = inboxFileSchema.parse(JSON.parse(text));
  t.ok(!('revoked' in inbox));
  const body = inbox as RenewOk;
  t.strictSame(
    { slot: body.slot, tokenId: body.tokenId, expiresAt: body.expiresAt, credentialGeneration: body.credentialGeneration },
    { slot: SLOT, tokenId: gwState?.tokenId, expiresAt: gwState?.expiresAt, credentialGeneration: 1 },
  );
  t.strictSame(gw.authority.isValidToken(body.token), { slot: SLOT, tokenId: body.tokenId, generation: 1 }, 'the real token');
  t.equal(inboxNames(e).length, 1, 'one file, no temp files left');
  t.ok(isBatchFileName(inboxNames(e)[0] ?? ''), 'a batch file (batch-<sequence>-<random>.json)');
  t.equal(entriesOf(e, inboxNames(e)[0] ?? '').length, 1, 'holding the one answer');
  const s = stateOnDisk(e);
  t.equal(s?.pending, undefined, 'pending cleared');
  t.strictSame(s?.delivered, { tokenId: body.tokenId, expiresAt: body.expiresAt, generation: 1, receivedAt: new Date(NOW).toISOString() });
  for (const f of ledgerFiles(e)) t.notMatch(readFileSync(f, 'utf8'), body.token, 'no token in fetch state');
  noSecretsLogged(t, e, [body.token, CRED]);

  // The next renewal is a new one: new requestId, expecting the token just delivered.
  const out2 = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out2.kind, 'renewed');
  t.not(gw.requests[1]?.requestId, gw.requests[0]?.requestId, 'a new renewal, a new requestId');
  t.equal(gw.requests[1]?.expectedTokenId, body.tokenId, 'CAS on the delivered token');
  t.equal(gw.minted(SLOT), 2);
  const body2 = renewOkSchema.parse(JSON.parse(inboxText(e)));
  t.equal(body2.credentialGeneration, 2, 'the inbox file now holds the newer answer');
});

t.test('409: adopts currentTokenId, clears pending; the next renewal uses a new requestId expecting it', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  t.equal((await renewSlot(e.deps, emptySlotFile(SLOT), CRED)).kind, 'renewed');
  const applied: SlotFile = { slot: SLOT, tokenId: gw.authority.slotState(SLOT)?.tokenId ?? null, expiresAt: gw.authority.slotState(SLOT)?.expiresAt ?? null, generation: 1 };
  const elsewhere = gw.advanceElsewhere(SLOT); // another host renewed: our view is stale

  const out = await renewSlot(e.deps, applied, CRED);
  t.strictSame(out, { kind: 'conflict', currentTokenId: elsewhere.tokenId });
  const conflictReq = gw.requests[1];
  t.equal(conflictReq?.expectedTokenId, applied.tokenId, 'it expected the token it knew');
  t.equal(conflictReq?.outcome, 409);
  const s = stateOnDisk(e);
  t.equal(s?.adopted, elsewhere.tokenId, 'adopted');
  t.equal(s?.pending, undefined, 'pending cleared');
  t.equal(gw.minted(SLOT), 1, 'a 409 mints nothing');

  const next = await renewSlot(e.deps, applied, CRED);
  t.equal(next.kind, 'renewed');
  const req = gw.requests[2];
  t.not(req?.requestId, conflictReq?.requestId, 'a new requestId');
  t.equal(req?.expectedTokenId, elsewhere.tokenId, 'expecting the adopted token');
  t.equal(gw.minted(SLOT), 2);
  const after = stateOnDisk(e);
  t.ok(after);
  if (after) t.equal(expectationFor(applied, after), gw.authority.slotState(SLOT)?.tokenId, 'from now on it expects the new token');
});

t.test('409 with currentTokenId null: adopts null', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  // The host thinks a token is applied, the Gateway never minted one.
  const stale: SlotFile = { slot: SLOT, tokenId: 'tok-ghost', expiresAt: '2030-01-01T12:30:00.000Z', generation: 4 };
  t.strictSame(await renewSlot(e.deps, stale, CRED), { kind: 'conflict', currentTokenId: null });
  t.equal(stateOnDisk(e)?.adopted, null);
  t.equal((await renewSlot(e.deps, stale, CRED)).kind, 'renewed');
  t.equal(gw.requests[1]?.expectedTokenId, null);
});

t.test('401: credential_invalid, no retry by itself, pending kept for the same requestId', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  const out = await renewSlot(e.deps, emptySlotFile(SLOT), 'wrong-credential-SECRET');
  t.strictSame(out, { kind: 'credential_invalid' });
  t.equal(gw.requests.length, 1, 'one request, no storm');
  const s = stateOnDisk(e);
  t.equal(s?.pending?.requestId, gw.requests[0]?.requestId, 'pending kept');
  t.strictSame(inboxNames(e), []);
  t.equal(gw.minted(SLOT), 0);
  noSecretsLogged(t, e, ['wrong-credential-SECRET']);

  // The 401 halted the link's one credential: nothing more goes out with it.
  t.strictSame(await renewSlot(e.deps, emptySlotFile(SLOT), CRED), { kind: 'credential_invalid' }, 'halted: not sent');
  t.equal(gw.requests.length, 1, 'nothing sent while halted');

  // A changed credential file resumes the link (what the renewal service reads each step).
  const credPath = join(e.root, 'host-credential');
  writeFileSync(credPath, `${CRED}\n`, { mode: 0o600 });
  t.equal(e.deps.credential.read().kind, 'ok', 'a changed credential resumes');
  gw.inject({ kind: 'status401' });
  t.strictSame(await renewSlot(e.deps, emptySlotFile(SLOT), CRED), { kind: 'credential_invalid' }, 'injected 401');
  t.equal(gw.requests[1]?.requestId, s?.pending?.requestId, 'same requestId');

  // A restarted link (a new credential object, the same durable state) renews with the same requestId.
  const restarted = { ...e.deps, credential: hostCredential(t, credPath, gw.url, e.deps.log) };
  t.equal((await renewSlot(restarted, emptySlotFile(SLOT), CRED)).kind, 'renewed', 'a fixed credential renews');
  t.equal(gw.requests[2]?.requestId, s?.pending?.requestId, 'still the same requestId');
  t.equal(gw.minted(SLOT), 1);
});

t.test('404: a revocation notice in the inbox, pending cleared', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  gw.revokeSlot(SLOT);
  t.strictSame(await renewSlot(e.deps, emptySlotFile(SLOT), CRED), { kind: 'revoked' });
  const text = inboxText(e);
  t.strictSame(inboxFileSchema.parse(JSON.parse(text)), { slot: SLOT, revoked: true, at: new Date(NOW).toISOString() });
  t.equal(statSync(inboxPath(e)).mode & 0o777, 0o640);
  t.equal(stateOnDisk(e)?.pending, undefined, 'pending cleared');

  // An injected 404 (state untouched on the Gateway) is reported the same way.
  const gw2 = await gateway(t, ['cli:notion']);
  const e2 = await env(t, gw2.url);
  gw2.inject({ kind: 'status404' });
  t.strictSame(await renewSlot(e2.deps, emptySlotFile('cli:notion'), CRED), { kind: 'revoked' });
  t.match(JSON.parse(inboxText(e2, 'cli:notion')) as unknown, { slot: 'cli:notion', revoked: true });
});

t.test('429: retry with retryAfterMs, same requestId next time', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  gw.inject({ kind: 'status429', retryAfterS: 7 });
  const out = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out.kind, 'retry');
  if (out.kind === 'retry') t.equal(out.retryAfterMs, 7_000);
  const pending = stateOnDisk(e)?.pending;
  t.ok(pending, 'pending kept');
  t.strictSame(inboxNames(e), []);

  gw.inject({ kind: 'status429', retryAfterS: new Date(NOW + 30_000).toUTCString() });
  const out2 = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out2.kind, 'retry');
  if (out2.kind === 'retry') t.equal(out2.retryAfterMs, 30_000, 'an HTTP date, against the injected clock');

  gw.inject({ kind: 'status5xx', status: 502 });
  const out3 = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out3.kind, 'retry', '5xx retries too');
  if (out3.kind === 'retry') t.equal(out3.retryAfterMs, undefined, 'no Retry-After, none invented');

  t.equal((await renewSlot(e.deps, emptySlotFile(SLOT), CRED)).kind, 'renewed');
  t.strictSame(
    gw.requests.map((r) => r.requestId),
    [pending?.requestId, pending?.requestId, pending?.requestId, pending?.requestId],
    'one renewal, one requestId across all its retries',
  );
  t.equal(gw.minted(SLOT), 1);
});

t.test('a lost answer after commit: the retry gets the same token, one minted', async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  gw.inject({ kind: 'dropAfterCommit' });
  const out = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out.kind, 'retry');
  t.strictSame(inboxNames(e), []);
  const out2 = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out2.kind, 'renewed');
  t.equal(gw.requests[0]?.requestId, gw.requests[1]?.requestId);
  t.equal(gw.minted(SLOT), 1);
});

/** A fake Gateway answering every request with a fixed status and body. */
async function fixedServer(t: TapTest, status: number, body: string): Promise<{ url: string; hits: () => number }> {
  let hits = 0;
  const server: Server = createServer((req, res) => {
    hits += 1;
    req.resume();
    req.on('end', () => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(body);
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  t.teardown(() => server.closeAllConnections());
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits: () => hits };
}

t.test('an invalid 200 body → retry, nothing written, pending kept', async (t) => {
  const valid: RenewOk = {
    slot: SLOT,
    tokenId: 'tok-1',
    token: 'gw_SECRET-token',
    expiresAt: '2030-01-01T13:00:00.000Z',
    credentialGeneration: 1,
  };
  const cases: Array<[string, string]> = [
    ['slot mismatch', JSON.stringify({ ...valid, slot: 'instance:other' })],
    ['not JSON', '{"slot": "instance:inst-1", "token": "gw_SECRET-tok'],
    ['bad token', JSON.stringify({ ...valid, token: 'gw_SECRET token' })],
    ['missing tokenId', JSON.stringify({ ...valid, tokenId: undefined })],
    ['local time', JSON.stringify({ ...valid, expiresAt: '2030-01-01T13:00:00' })],
  ];
  for (const [what, body] of cases) {
    const srv = await fixedServer(t, 200, body);
    const e = await env(t, srv.url);
    const out = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
    t.equal(out.kind, 'retry', `${what}: retry`);
    t.equal(srv.hits(), 1);
    t.strictSame(inboxNames(e), [], `${what}: nothing in the inbox`);
    const s = stateOnDisk(e);
    t.ok(s?.pending, `${what}: pending kept (the Gateway may have committed)`);
    t.equal(s?.delivered, undefined, `${what}: nothing recorded as delivered`);
    noSecretsLogged(t, e, ['SECRET', CRED]);
    if (out.kind === 'retry') t.notMatch(out.reason, 'SECRET', `${what}: reason carries no content`);
  }
});

t.test('a network error → retry with a reason that names no host or port', async (t) => {
  // A port that was just open and is now closed: connection refused.
  const probe = createServer();
  probe.listen(0, '127.0.0.1');
  await once(probe, 'listening');
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const e = await env(t, `http://127.0.0.1:${port}`);
  const out = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(out.kind, 'retry');
  if (out.kind !== 'retry') return;
  t.equal(out.retryAfterMs, undefined);
  t.ok(out.reason.length > 0);
  t.notMatch(out.reason, '127.0.0.1', 'no address');
  t.notMatch(out.reason, String(port), 'no port');
  t.notMatch(out.reason, 'localhost');
  t.notMatch(out.reason, CRED);
  const pending = stateOnDisk(e)?.pending;
  t.ok(pending, 'pending kept for the retry');
  const again = await renewSlot(e.deps, emptySlotFile(SLOT), CRED);
  t.equal(again.kind, 'retry');
  t.equal(stateOnDisk(e)?.pending?.requestId, pending?.requestId, 'same requestId on the next attempt');
  t.strictSame(inboxNames(e), []);
  noSecretsLogged(t, e, [CRED]);
});

t.test('expectationFor: adopted, else the newer of delivered and applied', async (t) => {
  const slot = (tokenId: string | null, generation: number): SlotFile => ({
    slot: SLOT,
    tokenId,
    expiresAt: tokenId === null ? null : '2030-01-01T13:00:00.000Z',
    generation,
  });
  const delivered = (tokenId: string, generation: number): RenewalSlotState['delivered'] => ({
    tokenId,
    generation,
    expiresAt: '2030-01-01T13:00:00.000Z',
    receivedAt: '2030-01-01T12:00:00.000Z',
  });
  t.equal(expectationFor(slot(null, 0), { slot: SLOT }), null, 'fresh slot: null');
  t.equal(expectationFor(slot('applied', 2), { slot: SLOT }), 'applied', 'only applied');
  t.equal(expectationFor(slot('applied', 2), { slot: SLOT, delivered: delivered('deliv', 3) }), 'deliv', 'delivered newer than applied');
  t.equal(expectationFor(slot('applied', 3), { slot: SLOT, delivered: delivered('applied', 3) }), 'applied', 'apply caught up');
  t.equal(expectationFor(slot('applied', 4), { slot: SLOT, delivered: delivered('deliv', 3) }), 'applied', 'applied newer than delivered');
  t.equal(
    expectationFor(slot('applied', 4), { slot: SLOT, delivered: delivered('deliv', 5), adopted: 'adopt' }),
    'adopt',
    'adopted beats both',
  );
  t.equal(expectationFor(slot('applied', 4), { slot: SLOT, delivered: delivered('deliv', 5), adopted: null }), null, 'an adopted null beats both too');
  t.equal(expectationFor(slot('applied', 4), { slot: SLOT, adopted: undefined }), 'applied', 'adopted undefined is no adoption');
});

t.test("cut: the caller's own controller; a halt of the link aborts it and the answer is credential_invalid", async (t) => {
  const gw = await gateway(t);
  const e = await env(t, gw.url);
  gw.inject({ kind: 'hang', commit: false });
  const cut = new AbortController();
  const renewal = renewSlot({ ...e.deps, cut }, emptySlotFile(SLOT), CRED);
  await gw.waitForRequests(1);
  // Another part of the link met a 401 with this credential.
  e.deps.credential.halt(CRED);
  t.strictSame(await renewal, { kind: 'credential_invalid' }, 'cut by the halt: halted, not a retry');
  t.ok(cut.signal.aborted, "the halt aborted the caller's controller");

  // Cut by its owner (its slot retired): a retry, and the link is not halted by it.
  const gw2 = await gateway(t);
  const e2 = await env(t, gw2.url);
  gw2.inject({ kind: 'hang', commit: false });
  const mine = new AbortController();
  const second = renewSlot({ ...e2.deps, cut: mine }, emptySlotFile(SLOT), CRED);
  await gw2.waitForRequests(1);
  mine.abort();
  t.equal((await second).kind, 'retry', 'cut by its owner: a retry');
  t.notOk(e2.deps.credential.halted, 'not a halt');
});
