import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { linkStatusSchema, type LinkStatus } from '../../src/data/link-status.js';
import { hostCredential } from '../support/host-credential.js';
import { recordLinkStatus } from '../../src/link/link-status.js';
import { memoryLogger } from '../support/memory-log.js';
import { until } from '../support/poll.js';
import { tempDir } from '../support/temp-dir.js';

/*
 * The link's status recorder (link-status.json for doctor and status), on a clock the test
 * moves: states and their `since`, the last sync and the last error kept across events, a
 * halt seen through the credential gate, the write throttle, and a directory it cannot
 * write (one warning, no throw).
 */

const CRED = 'hostcred-status-test-91d2f0';

function read(dir: string): LinkStatus | undefined {
  try {
    return linkStatusSchema.parse(JSON.parse(readFileSync(join(dir, 'link-status.json'), 'utf8')));
  } catch {
    return undefined;
  }
}

t.test('states, since, last sync and last error; a halt through the credential; the file is valid, 0640, and holds no credential', async (t) => {
  const dir = tempDir('ac-link-status-', t);
  const credPath = join(dir, 'cred');
  writeFileSync(credPath, `${CRED}\n`);
  const { log } = memoryLogger();
  const cred = hostCredential(t, credPath, 'http://127.0.0.1:9', log);
  let now = Date.parse('2026-01-01T00:00:00Z');
  const record = recordLinkStatus(dir, cred, log, () => now);

  record({ kind: 'answered', version: 3 });
  await until(() => read(dir)?.receivedVersion === 3, 'first answer written');
  const first = read(dir);
  t.equal(first?.state, 'polling');
  t.equal(first?.pid, process.pid);
  t.equal(first?.lastSyncAt, '2026-01-01T00:00:00.000Z');
  t.equal(first?.lastError, null);
  t.equal(statSync(join(dir, 'link-status.json')).mode & 0o777, 0o640);

  now += 5_000;
  record({ kind: 'failed', code: 'gateway_unavailable', detail: 'status 503' });
  await until(() => read(dir)?.state === 'backing_off', 'backing off written');
  const failed = read(dir);
  t.equal(failed?.since, '2026-01-01T00:00:05.000Z', 'since: the change');
  t.equal(failed?.lastSyncAt, '2026-01-01T00:00:00.000Z', 'the last sync is kept');
  t.same(failed?.lastError, { code: 'gateway_unavailable', detail: 'status 503', at: '2026-01-01T00:00:05.000Z' });
  t.equal(failed?.receivedVersion, 3, 'the received version is kept');

  now += 5_000;
  record({ kind: 'answered' });
  await until(() => read(dir)?.state === 'polling', 'polling again');
  t.equal(read(dir)?.lastError?.code, 'gateway_unavailable', 'the last error stays on record after recovery');
  t.equal(read(dir)?.lastSyncAt, '2026-01-01T00:00:10.000Z');

  now += 5_000;
  cred.halt(CRED);
  await until(() => read(dir)?.state === 'halted', 'a halt is recorded from the credential gate');
  t.equal(read(dir)?.lastError?.code, 'credential_rejected');
  t.notMatch(readFileSync(join(dir, 'link-status.json'), 'utf8'), CRED, 'no credential in the file');
});

t.test('answers with nothing new write at most once a second', async (t) => {
  const dir = tempDir('ac-link-status-', t);
  const { log } = memoryLogger();
  const cred = hostCredential(t, join(dir, 'cred'), 'http://127.0.0.1:9', log);
  let now = Date.parse('2026-01-01T00:00:00Z');
  const record = recordLinkStatus(dir, cred, log, () => now);
  record({ kind: 'answered' });
  await until(() => read(dir)?.lastSyncAt === '2026-01-01T00:00:00.000Z', 'first write');
  now += 200;
  record({ kind: 'answered' });
  now += 200;
  record({ kind: 'answered', version: 9 });
  // The version change is written; the bare answer before it was not, but its sync time is carried.
  await until(() => read(dir)?.receivedVersion === 9, 'a new version is written at once');
  t.equal(read(dir)?.lastSyncAt, '2026-01-01T00:00:00.400Z');
  now += 200;
  record({ kind: 'answered' });
  now += 1_000;
  record({ kind: 'answered' });
  await until(() => read(dir)?.lastSyncAt === '2026-01-01T00:00:01.600Z', 'an answer a second later is written');
});

t.test('a hand-off it cannot write: one warning, no throw, and it writes again once it can', async (t) => {
  const base = tempDir('ac-link-status-', t);
  const dir = join(base, 'gone');
  const { log, records } = memoryLogger();
  const cred = hostCredential(t, join(base, 'cred'), 'http://127.0.0.1:9', log);
  let now = Date.parse('2026-01-01T00:00:00Z');
  const record = recordLinkStatus(dir, cred, log, () => now);
  record({ kind: 'failed', code: 'network', detail: 'network: ECONNREFUSED' });
  now += 2_000;
  record({ kind: 'failed', code: 'rate_limited', detail: 'status 429' });
  await until(() => records.some((r) => r.msg.startsWith('could not write link-status.json')), 'the warning');
  now += 2_000;
  record({ kind: 'failed', code: 'network', detail: 'network: ECONNRESET' });
  mkdirSync(dir);
  now += 2_000;
  record({ kind: 'answered', version: 1 });
  await until(() => read(dir)?.receivedVersion === 1, 'written once the directory exists');
  t.equal(records.filter((r) => r.msg.startsWith('could not write link-status.json')).length, 1, 'warned once');
  rmSync(dir, { recursive: true });
});
