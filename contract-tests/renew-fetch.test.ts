import { randomUUID } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import t from 'tap';
import { checkNoLeaks, knownSecrets, leakedSecrets, type CliProc, type LogLine } from '../test/support/cli-proc.js';
import type { RenewRecord } from '../test/support/mock-renew-gateway.js';
import { until, within } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import {
  CREDENTIAL,
  WRONG_CREDENTIAL,
  allGateways,
  allRigs,
  crashes,
  figures,
  makeRig,
  readLedger,
  type InboxOk,
  type RenewRig,
} from './helpers/renew-harness.js';

// About 30 CLI processes start one after another (the SIGKILL walk alone is 94 s at load 45):
// a file-wide stop sized for a busy machine, not a timing check.
t.setTimeout(600_000);

/*
 * renew fetch, black-box against the built CLI and a MockRenewGateway (SPEC §4):
 * idempotent retries (one requestId per renewal, persisted before sending), crash safety
 * at every step, CAS with 409 adoption, Retry-After, 401 halt, 404 revocation, --once, and
 * no secret in any log line, slot file or private state file.
 */

const RENEWED = 'renewed; handed to apply';
const RETRYING = 'renewal failed; will retry with the same requestId';

function isOk(x: unknown): x is InboxOk {
  return typeof x === 'object' && x !== null && typeof (x as InboxOk).tokenId === 'string' && typeof (x as InboxOk).token === 'string';
}

function requestIds(records: RenewRecord[]): string[] {
  return records.map((r) => r.requestId ?? '<none>');
}

function logsOf(procs: CliProc[], msg: string): LogLine[] {
  return procs.flatMap((p) => p.logs.filter((l) => l.msg === msg));
}

/**
 * The state every recovery must converge to: the Gateway minted exactly one token for the
 * slot, fetch handed exactly that one to apply, apply writes it into the token file and
 * the slot file, fetch's pending requestId is settled, and a further run asks nothing.
 */
async function assertConverged(t: TapTest, rig: RenewRig, slot: string, requestId: string, opts: { idleCheck?: boolean } = {}): Promise<void> {
  const { gw } = rig;
  t.equal(gw.minted(slot), 1, 'the Gateway minted exactly one token for the slot');
  t.ok(gw.requestsFor(slot).length >= 1, 'the Gateway saw the renewal');
  t.same(new Set(requestIds(gw.requestsFor(slot))), new Set([requestId]), 'every request for the slot carried the one requestId');
  t.equal(gw.authority.mintedForRequest(requestId), 1, 'one token for that requestId');
  const gatewayTokenId = gw.authority.slotState(slot)?.tokenId;
  t.ok(gatewayTokenId, 'the Gateway holds a token for the slot');

  const inbox = rig.readInbox(slot);
  t.ok(isOk(inbox), 'inbox holds the renewal answer');
  if (!isOk(inbox)) return;
  t.equal(inbox.tokenId, gatewayTokenId, "inbox holds the Gateway's committed token");
  t.equal(statSync(rig.inboxPath(slot)).mode & 0o777, 0o640, 'inbox file is 0640');
  const names = rig.inboxNames().filter((n) => !n.startsWith('.'));
  t.ok(names.length >= 1 && names.every((n) => /^batch-\d{16}-[0-9a-f]{12}\.json$/.test(n)), 'nothing but batch files in inbox/ (and perhaps a dot-temp file)');
  // A crash between the batch write and the record re-delivers the same answer (the same
  // requestId replayed) in a second batch: apply ignores it as not newer.
  const answers = names.flatMap((n) => rig.batchEntries(n) ?? []);
  t.ok(answers.length >= 1 && answers.every((a) => isOk(a) && a.slot === slot && a.tokenId === gatewayTokenId), 'every entry the one committed answer');

  const priv = rig.readPrivate(slot);
  t.notOk(priv?.pending, "fetch's pending requestId is settled");
  t.equal(priv?.delivered?.tokenId, gatewayTokenId, 'fetch remembers what it handed to apply');

  const applied = await rig.apply();
  t.equal(applied.exit.code, 0, 'renew apply exits 0');
  t.ok(applied.proc.logs.some((l) => l.msg === 'token applied' && l.slot === slot && l.tokenId === gatewayTokenId), 'apply logged the token applied');
  t.equal(rig.readToken(slot), inbox.token, 'the token file holds the committed token');
  t.equal(statSync(rig.tokenFile(slot)).mode & 0o777, 0o600, 'token file is 0600');
  const slotFile = rig.readSlot(slot);
  t.equal(slotFile.tokenId, gatewayTokenId, 'slots/ names the applied tokenId');
  t.equal(slotFile.generation, inbox.credentialGeneration, 'slots/ has the generation');
  t.equal(rig.readInbox(slot), undefined, 'apply removed the inbox file');
  if (opts.idleCheck === false) return;

  const before = gw.requests.length;
  const again = await rig.fetchOnce(['--backoff-cap-ms', '200']);
  t.equal(again.exit.code, 0, 'a further fetch --once exits 0');
  t.equal(gw.requests.length, before, 'and asks the Gateway nothing: the slot is not due');
  t.equal(gw.minted(slot), 1, 'still exactly one token minted');
}

t.test('a dropped response: the retry carries the same requestId and gets the same token', async (t) => {
  const rig = await makeRig(t);
  const slot = 'instance:drop-01';
  rig.addSlot(slot);
  rig.gw.inject({ kind: 'dropAfterCommit' }, { slot });

  const { proc, exit } = await rig.fetchOnce(['--backoff-cap-ms', '200']);
  t.equal(exit.code, 0, 'fetch --once exits 0 once the retry settled');
  const reqs = rig.gw.requestsFor(slot);
  t.equal(reqs.length, 2, 'one lost answer, one retry');
  t.equal(reqs[0]?.outcome, 'dropped', 'the first answer was lost');
  t.ok(reqs[0]?.committed, 'after the Gateway committed');
  t.equal(reqs[1]?.outcome, 200, 'the retry got a 200');
  t.equal(reqs[1]?.requestId, reqs[0]?.requestId, 'with the same requestId');
  t.equal(reqs[1]?.expectedTokenId, null, 'and the same expectation');
  const retry = proc.logs.find((l) => l.msg === RETRYING);
  t.ok(retry, 'the loss was logged as a retry');
  t.match(retry?.reason, /^network/, 'as a network failure');
  const renewed = proc.logs.find((l) => l.msg === RENEWED);
  t.equal(renewed?.tokenId, rig.gw.authority.slotState(slot)?.tokenId, 'the renewed line names the committed tokenId');
  await assertConverged(t, rig, slot, reqs[0]?.requestId ?? '');
});

t.test('SIGKILL at each step, then a restart: no second token, state converges', async (t) => {
  const hooks = ['fetch-after-persist', 'fetch-after-receive', 'fetch-mid-inbox-write', 'fetch-after-inbox'] as const;
  for (const hook of hooks) {
    await t.test(`crash:${hook}`, async (t) => {
      const rig = await makeRig(t);
      const slot = `instance:crash-${hook}`;
      rig.addSlot(slot);

      // Whatever the crash, nothing partial may ever be visible as an inbox file.
      const torn: string[] = [];
      const watcher = setInterval(() => {
        for (const name of rig.inboxNames().filter((n) => !n.startsWith('.'))) {
          let entries: unknown[] | undefined;
          try {
            entries = rig.batchEntries(name);
          } catch {
            torn.push('partial JSON');
            continue;
          }
          if (entries !== undefined && !entries.every((e) => isOk(e))) torn.push('not a renewal answer');
        }
      }, 2);
      const crashed = await rig.fetchCrash(hook);
      clearInterval(watcher);
      t.equal(crashed.exit.signal, 'SIGKILL', 'fetch died at the crash point');
      t.same(torn, [], 'no partial inbox file was ever visible');

      const pending = rig.readPrivate(slot)?.pending;
      t.ok(pending, 'the requestId was persisted before the crash');
      const requestId = pending?.requestId ?? '';
      t.equal(pending?.expectedTokenId, null, 'with the expectation (no token yet)');
      const sentBefore = rig.gw.requestsFor(slot);
      if (hook === 'fetch-after-persist') {
        t.equal(sentBefore.length, 0, 'nothing was sent before the crash');
        t.equal(rig.gw.minted(slot), 0, 'nothing minted yet');
      } else {
        t.equal(sentBefore.length, 1, 'the first process sent once');
        t.equal(sentBefore[0]?.requestId, requestId, 'with the persisted requestId');
        t.ok(sentBefore[0]?.committed, 'and the Gateway committed it');
        t.equal(rig.gw.minted(slot), 1, 'one token minted');
      }
      if (hook === 'fetch-mid-inbox-write' || hook === 'fetch-after-receive' || hook === 'fetch-after-persist') {
        t.equal(rig.readInbox(slot), undefined, 'no answer in the inbox after the crash');
        t.ok(
          rig.inboxNames().every((n) => n.startsWith('.')),
          'at most a dot-temp file remains in inbox/',
        );
      }
      if (hook === 'fetch-mid-inbox-write') {
        // Proof that the crash really was mid-write: the half-written temp file is there.
        const temps = rig.inboxNames().filter((n) => n.startsWith('.'));
        t.equal(temps.length, 1, 'the half-written dot-temp file remains');
        const half = temps[0] ? readFileSync(`${rig.handoff}/inbox/${temps[0]}`, 'utf8') : '';
        t.ok(half.length > 0 && !half.endsWith('}\n'), 'and it is partial');
      }
      if (hook === 'fetch-after-inbox') {
        const inbox = rig.readInbox(slot);
        t.ok(isOk(inbox), 'the complete answer is in the inbox');
        t.equal(isOk(inbox) ? inbox.tokenId : undefined, rig.gw.authority.slotState(slot)?.tokenId, 'holding the committed token');
      }

      const restart = await rig.fetchOnce(['--backoff-cap-ms', '200']);
      t.equal(restart.exit.code, 0, 'the restarted fetch --once settles and exits 0');
      const after = rig.gw.requestsFor(slot);
      t.equal(after.length, sentBefore.length + 1, 'the restart sent exactly one request');
      t.equal(after.at(-1)?.requestId, requestId, 'the restart reused the persisted requestId');
      t.equal(after.at(-1)?.outcome, 200, 'and got a 200');
      await assertConverged(t, rig, slot, requestId);
    });
  }

  await t.test('after sending (the Gateway committed, the answer never came): SIGKILL from outside', async (t) => {
    const rig = await makeRig(t);
    const slot = 'instance:crash-after-send';
    rig.addSlot(slot);
    rig.gw.inject({ kind: 'hang', commit: true }, { slot });
    const proc = rig.startFetch(['--once']);
    const first = await within(rig.gw.waitForRequests(1), 10_000, 'the request to reach the Gateway');
    t.ok(first.committed, 'the Gateway committed before hanging');
    t.equal(rig.gw.minted(slot), 1, 'one token minted');
    proc.child.kill('SIGKILL');
    const exit = await within(proc.exited, 10_000, 'fetch to die');
    crashes.count += 1;
    t.equal(exit.signal, 'SIGKILL', 'fetch was killed while waiting for the answer');
    const pending = rig.readPrivate(slot)?.pending;
    t.equal(pending?.requestId, first.requestId, 'the requestId on the wire was the persisted one');
    t.equal(rig.readInbox(slot), undefined, 'nothing in the inbox yet');

    const restart = await rig.fetchOnce(['--backoff-cap-ms', '200']);
    t.equal(restart.exit.code, 0, 'the restarted fetch --once exits 0');
    const reqs = rig.gw.requestsFor(slot);
    t.equal(reqs.length, 2, 'one request per process');
    t.equal(reqs[1]?.requestId, first.requestId, 'both processes used the same requestId');
    t.equal(reqs[1]?.outcome, 200, 'the restart got the stored answer');
    await assertConverged(t, rig, slot, first.requestId ?? '');
  });
});

t.test('SIGKILL mid-append to the ledger and mid-compaction: every requestId sent is reused, one token per renewal', async (t) => {
  // `ledger-compact-early` compacts the ledger as soon as it holds more than its live
  // records (after the first slot's second line), so a run of three slots meets one.
  const cases = [
    { hook: 'link-ledger-mid-append', hooks: ['crash:link-ledger-mid-append'] },
    { hook: 'link-ledger-mid-compaction', hooks: ['crash:link-ledger-mid-compaction', 'ledger-compact-early'] },
    { hook: 'link-ledger-after-snapshot', hooks: ['crash:link-ledger-after-snapshot', 'ledger-compact-early'] },
  ] as const;
  for (const c of cases) {
    await t.test(c.hook, async (t) => {
      const rig = await makeRig(t);
      const slots = ['a', 'b', 'c'].map((x) => `instance:ledger-${x}`);
      for (const slot of slots) rig.addSlot(slot);
      const proc = rig.startFetch(['--once'], { AGENT_CONNECTORS_TEST_HOOKS: c.hooks.join(',') });
      const exit = await within(proc.exited, 15_000, `fetch with crash:${c.hook} to die`);
      t.equal(exit.signal, 'SIGKILL', 'the link died at the crash point');
      crashes.count += 1;
      rig.harvest();
      const dir = rig.privateStateDir();
      const files = readdirSync(dir).filter((n) => !n.startsWith('.')).sort();
      if (c.hook === 'link-ledger-mid-append') {
        const log = files.find((n) => /^ledger-\d+\.log$/.test(n)) ?? '';
        const text = readFileSync(`${dir}/${log}`, 'utf8');
        t.ok(text.length > 0 && !text.endsWith('\n'), 'the log ends in a torn line: the crash was mid-append');
      }
      if (c.hook === 'link-ledger-mid-compaction') t.same(files, ['ledger-1.log', 'ledger-2.log'], 'the next log begun, its snapshot not yet in place');
      if (c.hook === 'link-ledger-after-snapshot') t.same(files, ['ledger-1.log', 'ledger-2.log', 'ledger.snapshot'], 'the snapshot in place, the old log not yet removed');
      const sentBefore = new Map(slots.map((s) => [s, new Set(requestIds(rig.gw.requestsFor(s)))]));
      t.ok([...sentBefore.values()].some((ids) => ids.size > 0), 'some renewals were sent before the crash');

      const restart = rig.startFetch(['--once', '--backoff-cap-ms', '200'], c.hooks.length > 1 ? { AGENT_CONNECTORS_TEST_HOOKS: 'ledger-compact-early' } : {});
      const again = await within(restart.exited, 15_000, 'the restarted fetch --once');
      rig.harvest();
      t.equal(again.code, 0, 'the restarted fetch --once settles and exits 0');
      for (const slot of slots) {
        const sent = rig.gw.requestsFor(slot);
        const before = [...(sentBefore.get(slot) ?? [])];
        t.equal(rig.gw.minted(slot), 1, `${slot}: exactly one token minted`);
        t.equal(new Set(requestIds(sent)).size, 1, `${slot}: one requestId across both processes`);
        if (before.length > 0) t.equal(sent.at(-1)?.requestId, before[0], `${slot}: the requestId sent before the crash was reused`);
        t.equal(sent.at(-1)?.outcome, 200, `${slot}: settled with a 200`);
        t.notOk(rig.readPrivate(slot)?.pending, `${slot}: nothing pending in the ledger`);
        t.equal(rig.readPrivate(slot)?.delivered?.tokenId, rig.gw.authority.slotState(slot)?.tokenId, `${slot}: the ledger remembers the token handed over`);
      }
      t.same(
        readdirSync(dir).filter((n) => !n.startsWith('.') && !/^ledger(-\d+\.log|\.snapshot)$/.test(n)),
        [],
        'nothing but the ledger in the record directory',
      );
    });
  }
});

t.test("upgrade: a previous link's per-slot record and journal batch are folded into the ledger; its pending requestId is sent", async (t) => {
  const rig = await makeRig(t);
  const [fromRecord, fromJournal] = ['instance:old-record', 'instance:old-journal'];
  rig.addSlot(fromRecord);
  rig.addSlot(fromJournal);
  const dir = rig.privateStateDir();
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const since = new Date().toISOString();
  const idRecord = randomUUID();
  const idJournal = randomUUID();
  // What session 11's link left: the record with its pending requestId, and one whose
  // pending only the fsynced journal held (the record lost it to a power cut).
  writeFileSync(join(dir, `${fromRecord}.json`), `${JSON.stringify({ slot: fromRecord, pending: { requestId: idRecord, expectedTokenId: null, since } })}\n`, { mode: 0o600 });
  writeFileSync(join(dir, `${fromJournal}.json`), `${JSON.stringify({ slot: fromJournal })}\n`, { mode: 0o600 });
  writeFileSync(join(dir, 'pending-4.journal'), `${JSON.stringify({ slot: fromJournal, requestId: idJournal, expectedTokenId: null, since })}\n`, { mode: 0o600 });

  const { proc, exit } = await rig.fetchOnce(['--backoff-cap-ms', '200']);
  t.equal(exit.code, 0, 'fetch --once exits 0');
  t.ok(proc.logs.some((l) => l.msg === 'per-slot renewal records folded into the ledger and removed' && l.files === 3), 'the upgrade was logged');
  t.same(requestIds(rig.gw.requestsFor(fromRecord)), [idRecord], "the record's pending requestId was sent, no other");
  t.same(requestIds(rig.gw.requestsFor(fromJournal)), [idJournal], "the journal's pending requestId was sent, no other");
  t.same(readdirSync(dir).filter((n) => !n.startsWith('.')).sort(), ['ledger-1.log', 'ledger.snapshot'], 'the old files are gone; the ledger holds their state');
  t.equal(rig.readPrivate(fromRecord)?.delivered?.tokenId, rig.gw.authority.slotState(fromRecord)?.tokenId, 'the ledger remembers the token handed over');
});

t.test('409: a stale expectation is replaced by the adopted tokenId and a new requestId', async (t) => {
  // Short lifetime, so the loop renews again by itself after ~2/3 of it (1.1-1.3 s; the
  // test waits for that renewal, which meets the conflict). Everything below
  // is read from events (fetch's log lines, the Gateway's request records) or from state
  // once fetch has stopped: a later renewal of the loop may come at any time before that
  // on a busy machine, and must not change what the test reads. The deadlines are for a
  // loaded machine (a CLI's start alone took over 10 s at a load of 40 on 2 cores).
  const rig = await makeRig(t, { tokenLifetimeMs: 2_000 });
  const slot = 'instance:conflict-01';
  rig.addSlot(slot);
  const proc = rig.startFetch(['--backoff-cap-ms', '200']);
  // Each token handed over is harvested as its line arrives, before a later renewal of the
  // loop replaces it in the inbox: the leak checks search for every token minted.
  createInterface({ input: proc.child.stdout! }).on('line', (line) => {
    if (line.includes(RENEWED)) rig.harvest();
  });
  await proc.waitForLog((l) => l.msg === RENEWED && l.slot === slot, 30_000);
  // Long before the token fetch holds is due again: another host renews the slot, so
  // fetch's expectation is now stale.
  const elsewhere = rig.gw.advanceElsewhere(slot);
  const conflict = await proc.waitForLog((l) => l.msg?.includes('token conflict (409)') === true, 30_000);
  t.equal(conflict.currentTokenId, elsewhere.tokenId, 'the 409 line names the adopted tokenId');
  const iConflict = proc.logs.indexOf(conflict);
  // What fetch handed over last before the conflict: the token its stale request expected.
  const held = proc.logs.slice(0, iConflict).filter((l) => l.msg === RENEWED && l.slot === slot).pop()?.tokenId;
  const second = await proc.waitForLog((l) => l.msg === RENEWED && l.slot === slot, 30_000, iConflict);
  t.not(second.tokenId, held, 'a new token after the conflict');
  t.not(second.tokenId, elsewhere.tokenId, 'not the other host’s');
  await proc.stop('SIGTERM');

  const reqs = rig.gw.requestsFor(slot);
  const i409 = reqs.findIndex((r) => r.outcome === 409);
  t.ok(i409 > 0, 'the Gateway answered 409');
  const stale = reqs[i409];
  const retry = reqs[i409 + 1];
  t.equal(stale?.expectedTokenId, held, 'the stale request expected the token fetch held');
  t.equal(retry?.expectedTokenId, elsewhere.tokenId, 'the next request expected the adopted tokenId');
  t.not(retry?.requestId, stale?.requestId, 'under a new requestId');
  t.not(retry?.requestId, reqs[0]?.requestId, 'not the first renewal’s either');
  t.equal(retry?.outcome, 200, 'and succeeded');
  t.equal(rig.gw.authority.mintedForRequest(retry?.requestId ?? ''), 1, 'one token for it');

  // fetch has stopped: what it handed over last is final (the renewal after the conflict,
  // or one more of the loop's own).
  const last = proc.logs.filter((l) => l.msg === RENEWED && l.slot === slot).pop();
  t.equal(last?.tokenId, rig.gw.authority.slotState(slot)?.tokenId, "fetch handed over the Gateway's current token");
  const inbox = rig.readInbox(slot);
  t.equal(isOk(inbox) ? inbox.tokenId : undefined, last?.tokenId, 'the inbox holds it');
  t.notOk(rig.readPrivate(slot)?.pending, 'nothing pending');
  t.equal(rig.readPrivate(slot)?.adopted, undefined, 'the adoption was consumed');

  const applied = await rig.apply();
  t.equal(applied.exit.code, 0);
  t.equal(rig.readSlot(slot).tokenId, last?.tokenId, 'apply applied the renewal after the conflict');
  t.equal(rig.readToken(slot), isOk(inbox) ? inbox.token : undefined, 'token file holds it');
});

t.test('429 with Retry-After: the retry waits at least that long and keeps the requestId', async (t) => {
  const rig = await makeRig(t);
  const slot = 'instance:ratelimited-01';
  rig.addSlot(slot);
  // Retry-After: 1, the least in whole seconds, each of which this test waits.
  rig.gw.inject({ kind: 'status429', retryAfterS: 1 }, { slot });
  // A backoff cap far below Retry-After: only honouring Retry-After can make it wait 1 s.
  const { proc, exit } = await rig.fetchOnce(['--backoff-cap-ms', '100']);
  t.equal(exit.code, 0, 'fetch --once settles after the 429');
  const reqs = rig.gw.requestsFor(slot);
  t.equal(reqs.length, 2, 'one 429, one retry');
  t.equal(reqs[0]?.outcome, 429);
  t.equal(reqs[1]?.outcome, 200);
  t.equal(reqs[1]?.requestId, reqs[0]?.requestId, 'same requestId');
  const gap = (reqs[1]?.at ?? 0) - (reqs[0]?.at ?? 0);
  t.comment(`429 → retry arrived ${gap} ms after the 429 request`);
  // Retry-After counts from the moment the answer is received (RFC 9110 §10.2.3), and the
  // answer reaches fetch strictly after the 429 request reached the Gateway; so the
  // retry's arrival minus the 429 request's arrival is a lower bound, not a timing guess.
  t.ok(gap >= 1_000, `the retry was not sent before Retry-After had elapsed (gap ${gap} ms)`);
  const line = proc.logs.find((l) => l.msg === RETRYING);
  t.equal(line?.retryAfterMs, 1_000, 'the retry line reports Retry-After');
  t.ok(typeof line?.retryInMs === 'number' && line.retryInMs >= 1_000, 'and a wait of at least that');
  t.equal(line?.reason, 'status 429');
  await assertConverged(t, rig, slot, reqs[0]?.requestId ?? '', { idleCheck: false });
});

t.test('5xx and a connection reset: retried with backoff, same requestId', async (t) => {
  const rig = await makeRig(t);
  const slot = 'instance:flaky-01';
  rig.addSlot(slot);
  rig.gw.inject({ kind: 'status5xx', status: 502 }, { slot });
  rig.gw.inject({ kind: 'resetBeforeCommit' }, { slot });
  rig.gw.inject({ kind: 'status5xx', status: 503 }, { slot });
  const { proc, exit } = await rig.fetchOnce(['--backoff-cap-ms', '300']);
  t.equal(exit.code, 0, 'fetch --once settles');
  const reqs = rig.gw.requestsFor(slot);
  t.same(
    reqs.map((r) => r.outcome),
    [502, 'reset', 503, 200],
    'three failures, then success',
  );
  t.equal(new Set(requestIds(reqs)).size, 1, 'one requestId throughout');
  const retries = proc.logs.filter((l) => l.msg === RETRYING);
  t.same(
    retries.map((l) => l.attempt),
    [1, 2, 3],
    'attempts counted up',
  );
  t.same(
    retries.map((l) => (typeof l.reason === 'string' ? l.reason.replace(/^network: .*/, 'network') : l.reason)),
    ['status 502', 'network', 'status 503'],
    'each failure logged with its reason',
  );
  t.ok(
    retries.every((l) => typeof l.retryInMs === 'number' && l.retryInMs >= 0 && l.retryInMs <= 300),
    'each wait within the backoff cap',
  );
  await assertConverged(t, rig, slot, reqs[0]?.requestId ?? '', { idleCheck: false });
});

t.test('new slots renew concurrently, never more than --renew-concurrency at once; faults keep per-slot semantics', async (t) => {
  const rig = await makeRig(t);
  const BOUND = 4;
  const slots = Array.from({ length: 40 }, (_v, i) => `instance:burst-${String(i).padStart(2, '0')}`);
  for (const slot of slots) rig.addSlot(slot);
  // Faults on a few slots, met while others are in flight: each must still retry alone
  // with its one requestId, honouring Retry-After.
  rig.gw.inject({ kind: 'status5xx', status: 503 }, { slot: slots[3] });
  rig.gw.inject({ kind: 'status429', retryAfterS: 1 }, { slot: slots[17] });
  rig.gw.inject({ kind: 'dropAfterCommit' }, { slot: slots[29] });
  // Nothing is answered until BOUND renewals are open at once: one at a time never gets there.
  rig.gw.holdUntilInflight(BOUND);
  const { exit } = await rig.fetchOnce(['--renew-concurrency', String(BOUND), '--backoff-cap-ms', '200'], {}, 60_000);
  t.equal(exit.code, 0, 'fetch --once settles every slot');
  t.equal(rig.gw.maxInflight, BOUND, `at most ${BOUND} renewals in flight, and that many under a burst`);
  for (const slot of slots) {
    const reqs = rig.gw.requestsFor(slot);
    if (rig.gw.minted(slot) !== 1 || new Set(requestIds(reqs)).size !== 1) t.fail(`${slot}: one token, one requestId (${rig.gw.minted(slot)} minted, ${reqs.length} requests)`);
    if (!isOk(rig.readInbox(slot))) t.fail(`${slot}: handed to apply`);
  }
  t.same(rig.gw.requestsFor(slots[3] ?? '').map((r) => r.outcome), [503, 200], 'the 503 slot retried once');
  const limited = rig.gw.requestsFor(slots[17] ?? '');
  t.same(limited.map((r) => r.outcome), [429, 200], 'the 429 slot retried once');
  t.ok((limited[1]?.at ?? 0) - (limited[0]?.at ?? 0) >= 1_000, 'not before its Retry-After (counted from arrivals: a lower bound)');
  t.same(rig.gw.requestsFor(slots[29] ?? '').map((r) => r.outcome), ['dropped', 200], 'the lost answer was asked again');
});

t.test('a burst of new slots: 32 renewals in flight by default, never more', async (t) => {
  const rig = await makeRig(t);
  const slots = Array.from({ length: 100 }, (_v, i) => `instance:default-${String(i).padStart(3, '0')}`);
  for (const slot of slots) rig.addSlot(slot);
  // Nothing is answered until 32 renewals are open at once: a smaller default never gets there.
  rig.gw.holdUntilInflight(32);
  const { exit } = await rig.fetchOnce([], {}, 90_000);
  t.equal(exit.code, 0, 'fetch --once settles every slot');
  t.equal(rig.gw.maxInflight, 32, 'the default bound reached, never passed');
  t.equal(rig.gw.minted(), slots.length, 'one token per slot');
});

t.test('Retry-After pauses every slot: no renewal reaches the Gateway before it has passed', async (t) => {
  const rig = await makeRig(t);
  const BOUND = 8;
  const slots = Array.from({ length: 40 }, (_v, i) => `instance:paused-${String(i).padStart(2, '0')}`);
  for (const slot of slots) rig.addSlot(slot);
  // The first BOUND renewals are held until all are open, then all answered 429 with
  // Retry-After: 1 (the least in whole seconds; the backoff cap is a tenth of it). fetch has
  // no other request out, so whatever arrives next was sent after it read a 429, which it
  // may not do before Retry-After has passed.
  rig.gw.inject({ kind: 'status429', retryAfterS: 1 }, { times: BOUND });
  rig.gw.holdUntilInflight(BOUND);
  const { exit } = await rig.fetchOnce(['--renew-concurrency', String(BOUND), '--backoff-cap-ms', '100'], {}, 60_000);
  t.equal(exit.code, 0, 'fetch --once settles every slot');
  const limited = rig.gw.requests.slice(0, BOUND);
  t.ok(limited.every((r) => r.outcome === 429), `the first ${BOUND} answered 429`);
  // A lower bound, not a timing guess: each 429 reached fetch after its request reached the Gateway.
  const earliest = Math.min(...limited.map((r) => r.at)) + 1_000;
  const early = rig.gw.requests.slice(BOUND).filter((r) => r.at < earliest);
  t.same(early.map((r) => r.slot), [], 'no renewal of any slot arrived before Retry-After had passed');
  t.equal(rig.gw.minted(), slots.length, 'one token per slot');
});

t.test('a 429 storm slows renewal down and it completes: one token and one requestId per slot', async (t) => {
  const rig = await makeRig(t);
  const BOUND = 8;
  const slots = Array.from({ length: 40 }, (_v, i) => `instance:storm-${String(i).padStart(2, '0')}`);
  for (const slot of slots) rig.addSlot(slot);
  // Every renewal is refused (429, Retry-After: 1) for 3 s from the first.
  rig.gw.rateLimitWindow(3_000, 1);
  rig.gw.holdUntilInflight(BOUND);
  const { exit } = await rig.fetchOnce(['--renew-concurrency', String(BOUND), '--backoff-cap-ms', '2000'], {}, 90_000);
  t.equal(exit.code, 0, 'fetch --once settles every slot');
  t.ok(rig.gw.maxInflight <= BOUND, `never more than ${BOUND} in flight (${rig.gw.maxInflight})`);
  for (const slot of slots) {
    const reqs = rig.gw.requestsFor(slot);
    if (rig.gw.minted(slot) !== 1 || new Set(requestIds(reqs)).size !== 1) t.fail(`${slot}: one token, one requestId (${rig.gw.minted(slot)} minted, ${reqs.length} requests)`);
  }
  const refused = rig.gw.requests.filter((r) => r.outcome === 429).length;
  t.comment(`${refused} renewals answered 429 during the storm`);
  // Slowed down, not hammering: one wave per Retry-After (at most 4 in the 3 s), each at
  // most the bound, halved after each wave (8 + 4 + 2 + 1). Asking for every other slot
  // while one waits out its Retry-After meets a 429 for nearly every one of the 40.
  t.ok(refused <= 2 * BOUND, `at most ${2 * BOUND} renewals answered 429 (${refused}): the host paused and slowed down`);
});

t.test('401: a rejected credential halts renewals without a storm; a new credential resumes them', async (t) => {
  const rig = await makeRig(t);
  const slots = ['instance:halt-a', 'instance:halt-b', 'cli:halt-c'];
  for (const s of slots) rig.addSlot(s);
  rig.setCredential(WRONG_CREDENTIAL);
  const proc = rig.startFetch(['--backoff-cap-ms', '100']);
  const err = await proc.waitForLog((l) => l.level === 'error' && /credential rejected/.test(String(l.msg)), 10_000);
  t.match(String(err.msg), /401/, 'the error line says the Gateway answered 401');
  // Nothing can prove a negative instantly: watch the loop for a few seconds.
  await new Promise((r) => setTimeout(r, 3_000));
  t.ok(rig.gw.requests.length >= 1 && rig.gw.requests.length <= 3, `at most one request per slot (saw ${rig.gw.requests.length})`);
  for (const s of slots) t.ok(rig.gw.requestsFor(s).length <= 1, `${s} was asked at most once`);
  t.ok(
    rig.gw.requests.every((r) => r.outcome === 401),
    'every request was refused',
  );
  t.equal(rig.gw.minted(), 0, 'nothing minted');
  t.notOk(proc.logs.some((l) => l.msg === RETRYING), 'a 401 is not retried as a transient failure');
  t.equal(proc.child.exitCode, null, 'fetch keeps running (halted, not dead)');

  const refused = rig.gw.requests.length;
  rig.setCredential(CREDENTIAL);
  proc.child.kill('SIGHUP');
  await until(() => logsOf([proc], RENEWED).length >= 3, 'all three slots renewed', 10_000);
  rig.harvest();
  t.ok(proc.logs.some((l) => l.msg === 'host credential changed; resuming renewals'), 'resumption logged');
  t.equal(rig.gw.minted(), 3, 'one token per slot once the credential is right');
  for (const s of slots) {
    t.equal(rig.gw.minted(s), 1, `${s}: one token`);
    const inbox = rig.readInbox(s);
    t.equal(isOk(inbox) ? inbox.tokenId : undefined, rig.gw.authority.slotState(s)?.tokenId, `${s}: inbox holds it`);
  }
  const later = rig.gw.requests.slice(refused);
  t.ok(later.every((r) => r.outcome === 200), 'after the change every request succeeded');
  await proc.stop('SIGTERM');
  t.equal((await rig.apply()).exit.code, 0, 'apply applies all three');
  for (const s of slots) t.equal(rig.readSlot(s).tokenId, rig.gw.authority.slotState(s)?.tokenId, `${s} applied`);
});

t.test('404: a revoked slot gets a revocation notice, apply marks it, fetch stops asking', async (t) => {
  const rig = await makeRig(t);
  const gone = 'instance:revoked-01';
  const live = 'instance:live-01';
  rig.addSlot(gone);
  rig.gw.revokeSlot(gone);
  const proc = rig.startFetch(['--backoff-cap-ms', '100']);
  await proc.waitForLog((l) => l.msg === 'slot revoked by the Gateway (404); no more renewals for it' && l.slot === gone, 10_000);
  const notice = rig.readInbox(gone);
  t.match(notice, { slot: gone, revoked: true }, 'fetch wrote a revocation notice to the inbox');
  t.notOk(rig.readPrivate(gone)?.pending, 'nothing pending for the revoked slot');

  const applied = await rig.apply();
  t.equal(applied.exit.code, 0, 'apply exits 0');
  t.equal(rig.readSlot(gone).revoked, true, 'slots/<slot>.json is marked revoked');
  t.equal(rig.readInbox(gone), undefined, 'the notice was consumed');

  // A new slot wakes the running fetch; by the time it renews that one it has re-read the
  // revoked slot file, and must not have asked for the revoked slot again.
  rig.addSlot(live);
  await proc.waitForLog((l) => l.msg === RENEWED && l.slot === live, 10_000);
  rig.harvest();
  await proc.stop('SIGTERM');
  t.equal(rig.gw.requestsFor(gone).length, 1, 'the running fetch asked for the revoked slot once');

  const again = await rig.fetchOnce(['--backoff-cap-ms', '100']);
  t.equal(again.exit.code, 0, 'a fresh fetch --once exits 0');
  t.equal(rig.gw.requestsFor(gone).length, 1, 'and never asks for the revoked slot');
});

t.test('--once: exit 0 when every due slot settled, exit 1 when the Gateway keeps failing past the budget', async (t) => {
  const rig = await makeRig(t);
  const a = 'instance:once-a';
  const b = 'cli:once-b';
  rig.addSlot(a);
  rig.addSlot(b);
  const ok = await rig.fetchOnce(['--backoff-cap-ms', '100']);
  t.equal(ok.exit.code, 0, 'exit 0: both slots settled');
  t.equal(logsOf([ok.proc], RENEWED).length, 2, 'two renewals handed over');
  for (const s of [a, b]) t.ok(isOk(rig.readInbox(s)), `${s} in the inbox`);
  t.equal((await rig.apply()).exit.code, 0);

  const c = 'instance:once-failing';
  rig.addSlot(c);
  rig.gw.inject({ kind: 'status5xx', status: 503 }, { slot: c, times: 1_000 });
  const fail = await rig.fetchOnce(['--once-budget-ms', '1500', '--backoff-cap-ms', '200'], {}, 20_000);
  t.equal(fail.exit.code, 1, 'exit 1: a slot did not settle within the budget');
  const failed = rig.gw.requestsFor(c);
  t.ok(failed.length >= 2, `it retried within the budget (${failed.length} requests)`);
  t.equal(new Set(requestIds(failed)).size, 1, 'every retry with the same requestId');
  t.equal(rig.gw.minted(c), 0, 'nothing minted');
  t.equal(rig.readInbox(c), undefined, 'nothing in the inbox');
  const pending = rig.readPrivate(c)?.pending;
  t.equal(pending?.requestId, failed[0]?.requestId, 'the renewal stays pending under its requestId');

  // The next timer run continues the same renewal.
  rig.gw.clearFaults();
  const next = await rig.fetchOnce(['--backoff-cap-ms', '100']);
  t.equal(next.exit.code, 0, 'the next run settles it');
  t.equal(rig.gw.requestsFor(c).at(-1)?.requestId, failed[0]?.requestId, 'with the same requestId');
  t.equal(rig.gw.minted(c), 1, 'one token');
  t.equal(rig.gw.requestsFor(a).length + rig.gw.requestsFor(b).length, 2, 'settled slots were not asked again');
});

t.test('no credential or token in slot files or in fetch private state', async (t) => {
  for (const rig of allRigs) rig.harvest();
  t.ok(knownSecrets.has(CREDENTIAL) && knownSecrets.has(WRONG_CREDENTIAL), 'both credentials are searched for');
  const minted = allGateways.reduce((n, g) => n + g.minted(), 0);
  t.ok(knownSecrets.size >= 2 + minted, `every minted token is searched for (${knownSecrets.size} secrets, ${minted} minted)`);
  const files = allRigs.flatMap((r) => r.secretFreeFiles());
  t.ok(files.some((f) => f.includes('/slots/')), 'slot files were written');
  t.ok(files.some((f) => f.includes('/link/')), 'fetch private state was written');
  const leaks = files.flatMap((f) => leakedSecrets(readFileSync(f, 'utf8')).map(() => f));
  t.same(leaks, [], 'no secret in any slot file or private state file');
  const stderr = allRigs.flatMap((r) => r.procs.flatMap((p) => p.stderr)).join('\n');
  t.same(leakedSecrets(stderr), [], 'no secret on stderr');
});

checkNoLeaks(t);

t.test('figures', async (t) => {
  // Handed over: logged so, or recorded delivered in the link's ledger (a crash after the
  // record's line and before the log line, the ledger's crash tests, leaves only the record).
  const handedOver = new Set([
    ...allRigs.flatMap((r) => logsOf(r.procs, RENEWED).map((l) => String(l.tokenId))),
    ...allRigs.flatMap((r) => [...readLedger(r.privateStateDir()).values()].flatMap((p) => (p.delivered ? [p.delivered.tokenId] : []))),
  ]);
  const f = figures(handedOver);
  // Every committed requestId minted exactly once.
  const committedIds = allGateways.flatMap((g) => g.requests.filter((r) => r.committed).map((r) => ({ g, id: r.requestId ?? '' })));
  t.ok(
    committedIds.every(({ g, id }) => g.authority.mintedForRequest(id) === 1),
    'no requestId minted more than one token',
  );
  t.ok(f.tokensMinted > 0 && f.faultsInjected > 0, 'the file renewed and injected faults');
  t.comment('FIGURES ' + JSON.stringify(f));
  t.equal(f.duplicates, 0, 'duplicates: every minted token was handed to apply');
});
