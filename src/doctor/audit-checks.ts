import { stat } from 'node:fs/promises';
import { readAuditSpool } from '../data/audit-event.js';
import type { LinkStatus } from '../data/link-status.js';
import { AUDIT_DIR_NOT_SETGID, AUDIT_SPOOL_FULL, AUDIT_UPLOAD_STALE } from '../data/problem-codes.js';
import { LINK_UNIT } from '../data/unit-names.js';
import { processAlive } from '../fs/process-alive.js';
import { ago, type Findings } from './finding.js';

/**
 * doctor's checks of the native_cli audit spool (SPEC §9, docs/audit.md): the directory
 * as tmpfiles makes it, how many events wait against the bound, how many a full spool
 * dropped, and on an enrolled host whether the link still gets them to the Gateway.
 */

/**
 * Events older than this with no accepted upload as recent: twice the uploader's backoff
 * cap (5 min), so a Gateway hiccup the link is still retrying through is not reported.
 */
export const AUDIT_STALE_MS = 10 * 60_000;

export interface AuditCheckOptions {
  dir: string;
  now: number;
  /** Expected owner and group ids (undefined: the account is missing, reported elsewhere). */
  uid: number | undefined;
  gid: number | undefined;
  enrolled: boolean;
  /** The link's own record; undefined when it wrote none (or an invalid one). */
  link: LinkStatus | undefined;
}

/** Why an enrolled host's spool is not draining, as far as the link's status file tells. */
function whyNotUploaded(link: LinkStatus | undefined): { cause: string; fix: string } {
  const logs = `journalctl -u ${LINK_UNIT}`;
  if (!link) return { cause: 'the link has not reported its state (link-status.json): it is not running as an enrolled link', fix: `systemctl restart ${LINK_UNIT}; ${logs}` };
  if (!processAlive(link.pid)) return { cause: `the link (pid ${link.pid}) is not running`, fix: `systemctl restart ${LINK_UNIT}; ${logs}` };
  switch (link.state) {
    case 'halted':
    case 'credential_unusable':
      return { cause: `the link is ${link.state === 'halted' ? 'halted: the Gateway refused the host credential (401)' : 'without a usable host credential'}, which stops the upload too`, fix: logs };
    case 'backing_off':
      return { cause: `the Gateway is failing the link (backing off since ${link.since}, last error ${link.lastError?.code ?? 'unknown'})`, fix: logs };
    case 'polling':
      return { cause: 'the link reaches the Gateway, so its audit uploads fail or it runs with --no-audit', fix: `${logs} -g 'audit upload'` };
  }
}

export async function auditChecks(o: AuditCheckOptions, out: Findings): Promise<void> {
  const dir = o.dir;
  const st = await stat(dir).catch(() => undefined);
  if (!st) {
    out.problem('directory_missing', 'audit', `${dir} is missing: the cli-proxy records no CLI call`, 'systemd-tmpfiles --create agent-connectors.conf');
    return;
  }
  const mode = st.mode & 0o7777;
  const owner = 'agent-connectors:agent-connectors-renew';
  // -R: event files already written with the wrong group must become readable to the link too.
  if ((o.uid !== undefined && st.uid !== o.uid) || (o.gid !== undefined && st.gid !== o.gid)) out.problem('directory_owner', 'audit', `${dir} is not owned by ${owner}`, `chown -R ${owner} ${dir}`);
  else if (mode === 0o770)
    out.warn(AUDIT_DIR_NOT_SETGID, 'audit', `${dir} has mode 770, not tmpfiles' 2770 (the cli-proxy or the link made it): new events get the cli-proxy's group, which the link cannot read when it runs as another user`, `chmod 2770 ${dir}`);
  else if (mode !== 0o2770) out.problem('directory_mode', 'audit', `${dir} has mode ${mode.toString(8)}, expected 2770`, `chmod 2770 ${dir}`);
  else out.ok('audit', `${dir} 2770 ${owner}`);

  const s = await readAuditSpool(dir);
  const bound = `${s.maxEvents}${s.maxEventsRecorded ? '' : ' (the default: no cli-proxy has recorded its own)'}`;
  const dropped = s.dropped > 0 ? `${s.dropped} dropped so far (a full spool drops the oldest)` : 'none dropped';
  const lastUpload = s.upload ? `last upload accepted ${s.upload.lastUploadAt} (${ago(Date.parse(s.upload.lastUploadAt), o.now)})` : 'no upload accepted yet';
  const waiting = `${s.events} event(s) waiting of at most ${bound}, ${dropped}; ${lastUpload}`;
  const why = o.enrolled ? whyNotUploaded(o.link) : { cause: 'the host is not enrolled, so nothing uploads the spool', fix: 'enrol the host, or run the cli-proxy with --no-audit' };

  const full = s.events >= s.maxEvents;
  if (full) out.warn(AUDIT_SPOOL_FULL, 'audit', `the spool is full: ${waiting}; every CLI call now drops the oldest event: ${why.cause}`, why.fix);
  const oldestMs = s.oldestAt === undefined ? 0 : o.now - s.oldestAt;
  const uploadMs = s.upload ? o.now - Date.parse(s.upload.lastUploadAt) : Infinity;
  const stale = o.enrolled && oldestMs > AUDIT_STALE_MS && uploadMs > AUDIT_STALE_MS;
  if (stale && s.oldestAt !== undefined)
    out.warn(AUDIT_UPLOAD_STALE, 'audit', `events are not reaching the Gateway: the oldest waits since ${new Date(s.oldestAt).toISOString()} (${ago(s.oldestAt, o.now)}); ${waiting}: ${why.cause}`, why.fix);
  if (!full && !stale) out.ok('audit', o.enrolled ? waiting : `${waiting} (not enrolled: nothing uploads them)`);
}
