import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { auditEventFileName, type AuditEvent } from '../../src/data/audit-event.js';
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
