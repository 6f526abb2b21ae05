import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { AUDIT_BATCH_MAX, auditEventFileName, type AuditEvent } from '../../src/data/audit-event.js';
import { createAuditUpload, defaultAuditUploadConfig } from '../../src/link/audit-upload.js';
import { hostCredential } from '../support/host-credential.js';
import { createNotifier } from '../../src/service/sd-notify.js';
import { runServices } from '../../src/service/service.js';
import { memoryLogger } from '../support/memory-log.js';
import { MockHostGateway } from '../support/mock-host-gateway.js';
import { until } from '../support/poll.js';
import { tempDir } from '../support/temp-dir.js';

function spoolEvent(dir: string): AuditEvent {
  const event: AuditEvent = {
    id: randomUUID(),
    time: new Date().toISOString(),
    provider: 'saas',
    method: 'GET',
    path: '/x',
    status: 200,
    bytesIn: 0,
    bytesOut: 1,
    durationMs: 1,
    peerUid: 0,
  };
  // Written in place (not atomically): the uploader must not care how a file arrived.
  writeFileSync(join(dir, auditEventFileName(event)), JSON.stringify(event), { mode: 0o640 });
  return event;
}

/** The spooled events (the link's upload.json and the writer's dropped.json are not events). */
function spooled(dir: string): string[] {
  return readdirSync(dir).filter((n) => /^\d{15}-/.test(n));
}

t.test('an event spooled right after an upload goes up at the end of the gap, not at the next rescan; a 401 halts the upload', async (t) => {
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { 'host-1': 'cred-audit-unit' } });
  t.teardown(() => gw.close());
  const root = tempDir('ac-audit-up-', t);
  const dir = join(root, 'audit');
  mkdirSync(dir, { recursive: true });
  const credentialPath = join(root, 'credential');
  writeFileSync(credentialPath, 'cred-audit-unit\n', { mode: 0o600 });
  const { log, lines } = memoryLogger();
  const upload = createAuditUpload(
    // A rescan far beyond the test's timeout: only the file events and the gap can send.
    { ...defaultAuditUploadConfig, dir, minGapMs: 3_000, rescanMs: 600_000, backoff: { baseMs: 50, capMs: 200 } },
    hostCredential(t, credentialPath, gw.url, log),
  );
  const signals = new EventEmitter();
  const running = runServices([upload], { log, notifier: createNotifier({ env: {} }), signals, forceExitAfterMs: false });

  const first = spoolEvent(dir);
  await until(() => gw.control.auditEvents.length === 1, 'first event stored');
  await until(() => lines.some((l) => l.includes('audit events uploaded')) && spooled(dir).length === 0, 'first upload done');
  // Within the gap after that upload, while the loop rests for the rescan.
  const second = spoolEvent(dir);
  await until(() => gw.control.auditEvents.length === 2, 'second event stored within the gap, not the rescan', 20_000);
  t.same(gw.control.auditEvents.map((r) => r.event.id), [first.id, second.id]);
  await until(() => spooled(dir).length === 0, 'both deleted once accepted');

  gw.control.revokeHost('host-1');
  spoolEvent(dir);
  await until(() => lines.some((l) => l.includes('host credential rejected by the Gateway (401)')), 'a 401 halts the link');
  t.equal(spooled(dir).length, 1, 'a refused event stays spooled');
  t.notOk(lines.join('\n').includes('cred-audit-unit'), 'the credential is never logged');
  t.match(JSON.parse(readFileSync(join(dir, 'upload.json'), 'utf8')), { lastAccepted: 1 }, 'upload.json records the last accepted batch for status');

  signals.emit('SIGTERM', 'SIGTERM');
  await running;
});

t.test('a flood drains back to back: every one of N ≫ a batch events arrives, none dropped; a 429 is still waited out', async (t) => {
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { 'host-1': 'cred-audit-flood' } });
  t.teardown(() => gw.close());
  const root = tempDir('ac-audit-flood-', t);
  const dir = join(root, 'audit');
  mkdirSync(dir, { recursive: true });
  const credentialPath = join(root, 'credential');
  writeFileSync(credentialPath, 'cred-audit-flood\n', { mode: 0o600 });
  const { log, lines } = memoryLogger();
  // Gap and rescan far beyond the test's timeout: only back-to-back batches can drain the
  // spool in time (issue 21: one batch per gap lost 53 000 of 90 000 events to the spool's bound).
  const upload = createAuditUpload(
    { ...defaultAuditUploadConfig, dir, minGapMs: 600_000, rescanMs: 600_000, backoff: { baseMs: 50, capMs: 200 } },
    hostCredential(t, credentialPath, gw.url, log),
  );
  // The first two uploads fail (503, then 429 with Retry-After): the drain waits them out, then goes on.
  gw.inject({ kind: 'status5xx', status: 503 }, { endpoint: 'audit' });
  gw.inject({ kind: 'status429', retryAfterS: 1 }, { endpoint: 'audit' });
  const signals = new EventEmitter();
  const running = runServices([upload], { log, notifier: createNotifier({ env: {} }), signals, forceExitAfterMs: false });

  // Whole batches: a remainder below a batch waits for the gap, as it should.
  const n = 12 * AUDIT_BATCH_MAX;
  const ids = new Set<string>();
  for (let i = 0; i < n; i++) ids.add(spoolEvent(dir).id);
  await until(() => gw.control.auditEvents.length >= n, `all ${n} events stored`, 60_000).catch((err: unknown) => {
    t.comment(`stored ${gw.control.auditEvents.length}; faults ${JSON.stringify(gw.faultsFired)}; spooled ${spooled(dir).length}\n${lines.slice(-8).join("\n")}`);
    throw err;
  });
  t.equal(gw.control.auditEvents.length, n, 'each event stored once');
  t.same(new Set(gw.control.auditEvents.map((r) => r.event.id)), ids, 'exactly the spooled events');
  t.ok(gw.auditBodies.every((b) => b.dropped === 0), 'no upload reports a dropped event');
  t.ok(gw.auditBodies.every((b) => b.events.length <= AUDIT_BATCH_MAX), 'batches keep their bound');
  await until(() => spooled(dir).length === 0, 'the spool is empty once all is accepted');
  const retry = lines.map((l) => JSON.parse(l) as { msg?: string; retryInMs?: number }).find((l) => l.msg?.startsWith('audit upload failed') && (l.retryInMs ?? 0) >= 1_000);
  t.ok(retry, 'the 429 was waited out for its Retry-After');
  t.equal(gw.faultsFired.status429, 1, 'the 429 fired');

  signals.emit('SIGTERM', 'SIGTERM');
  await running;
});
