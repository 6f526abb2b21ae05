import { execFileSync } from 'node:child_process';
import { symlinkSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { DROPPED_FILE, readAuditSpool, SPOOL_FILE, UPLOAD_STATUS_FILE } from '../../src/data/audit-event.js';
import { LINK_STATUS_FILE, readLinkStatus } from '../../src/data/link-status.js';
import { readReceived } from '../../src/doctor/link-checks.js';
import { tempDir } from '../support/temp-dir.js';

/**
 * doctor and status run as root and read files the link writes (the hand-off root, the
 * audit spool). A link that plants a FIFO or a link to /dev/zero there must not hang them
 * or fill their memory: each such file reads as absent or invalid, at once. (Before, a
 * FIFO blocked the read for good and /dev/zero grew it without end: these tests time out.)
 */
t.setTimeout(30_000);

t.test('link-status.json and desired-state.json as a FIFO or a link to /dev/zero: absent or invalid, at once', async (t) => {
  for (const plant of ['fifo', 'zero'] as const) {
    const handoff = tempDir('ac-hostile-', t);
    const put = (name: string): void => {
      if (plant === 'fifo') execFileSync('mkfifo', [join(handoff, name)]);
      else symlinkSync('/dev/zero', join(handoff, name));
    };
    put(LINK_STATUS_FILE);
    put('desired-state.json');
    t.equal((await readLinkStatus(handoff)).kind, 'absent', `${plant}: link-status.json reads as absent`);
    t.equal((await readReceived(handoff)).kind, 'none', `${plant}: desired-state.json reads as none`);
  }
});

t.test('the audit spool\'s own files as FIFOs: the summary comes back with defaults', async (t) => {
  const dir = tempDir('ac-hostile-audit-', t);
  for (const name of [SPOOL_FILE, DROPPED_FILE, UPLOAD_STATUS_FILE]) execFileSync('mkfifo', [join(dir, name)]);
  const summary = await readAuditSpool(dir);
  t.equal(summary.dropped, 0, 'dropped: 0');
  t.equal(summary.maxEventsRecorded, false, 'no bound recorded');
  t.equal(summary.upload, undefined, 'no upload status');
});
