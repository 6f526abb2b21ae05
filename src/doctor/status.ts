import { readAppliedState } from '../data/applied-state.js';
import { readAuditSpool } from '../data/audit-event.js';
import { handoffPaths, readSlots } from '../data/handoff.js';
import { HOST_STATUS_FORMAT, hostStatusSchema, type HostStatus, type PartState } from '../data/host-status.js';
import { readLinkStatus } from '../data/link-status.js';
import { rejectionPending, type PartHealth } from '../data/problem-codes.js';
import { APPLY_UNIT, LINK_UNIT } from '../data/unit-names.js';
import { processAlive } from '../fs/process-alive.js';
import { ago, untilText } from './finding.js';
import { readEnrolment, readReceived } from './link-checks.js';
import { probeHealth, systemdRunning, unitState } from './probe.js';

export interface StatusOptions {
  handoffDir: string;
  credentialPath: string;
  forwarderUrl: string;
  cliProxyUrl: string;
  /** Ask systemd about the link and apply (when it is the init system). */
  systemd: boolean;
  version: string;
  now?: number;
  /** The native_cli audit spool; omitted: no audit summary. */
  auditDir?: string;
}

const fromHealth: Record<PartHealth, PartState> = { ok: 'up', degraded: 'degraded', down: 'down' };

/** The host at a glance (data/host-status.ts): read-only, no verdict (that is doctor's). */
export async function hostStatus(o: StatusOptions): Promise<HostStatus> {
  const now = o.now ?? Date.now();
  const [fwd, cli] = await Promise.all([probeHealth(o.forwarderUrl), probeHealth(o.cliProxyUrl)]);
  const enrolment = await readEnrolment(o.credentialPath);
  const linkRead = await readLinkStatus(o.handoffDir);
  const link = linkRead.kind === 'ok' ? linkRead.status : undefined;
  const linkRunning = link ? processAlive(link.pid) : false;
  const systemd = o.systemd && (await systemdRunning());
  const viaUnit = async (unit: string): Promise<{ state: PartState; via: 'systemd' }> => ({ state: (await unitState(unit)).state === 'active' ? 'up' : 'down', via: 'systemd' });
  const linkPart = systemd
    ? await viaUnit(LINK_UNIT)
    : link
      ? { state: linkRunning ? ('up' as const) : ('down' as const), via: 'link-status' as const }
      : { state: 'unknown' as const, via: 'none' as const };
  const applyPart = systemd ? await viaUnit(APPLY_UNIT) : { state: 'unknown' as const, via: 'none' as const };
  const applied = await readAppliedState(o.handoffDir);
  const received = await readReceived(o.handoffDir);
  const { slots } = await readSlots(handoffPaths(o.handoffDir));
  const spool = o.auditDir ? await readAuditSpool(o.auditDir).catch(() => ({ events: 0, dropped: 0, upload: undefined })) : undefined;
  return hostStatusSchema.parse({
    ...(spool?.upload ? { lastAuditUpload: spool.upload.lastUploadAt } : {}),
    ...(spool ? { audit: { spooled: spool.events, dropped: spool.dropped } } : {}),
    format: HOST_STATUS_FORMAT,
    version: o.version,
    generatedAt: new Date(now).toISOString(),
    parts: {
      forwarder: { state: fromHealth[fwd.health], via: 'healthz' },
      'cli-proxy': { state: fromHealth[cli.health], via: 'healthz' },
      link: linkPart,
      apply: applyPart,
    },
    enrolment,
    ...(link
      ? { link: { state: link.state, since: link.since, running: linkRunning, lastSyncAt: link.lastSyncAt, lastError: link.lastError ? { code: link.lastError.code, at: link.lastError.at } : null } }
      : {}),
    state: {
      applied: applied && applied.appliedAt !== null ? applied.version : null,
      appliedAt: applied?.appliedAt ?? null,
      received: received.kind === 'ok' ? received.state.version : received.kind === 'invalid' ? received.version : null,
      ...(applied?.rejected && rejectionPending(applied) ? { rejected: { version: applied.rejected.version, at: applied.rejected.at, error: applied.rejected.error } } : {}),
    },
    slots: slots.map((s) => ({
      slot: s.slot,
      tokenId: s.tokenId,
      expiresAt: s.expiresAt,
      expiresInS: s.expiresAt ? Math.round((Date.parse(s.expiresAt) - now) / 1000) : null,
      revoked: s.revoked === true,
    })),
  });
}

/** The same, for a person: a few lines. */
export function statusText(s: HostStatus, now: number): string {
  const lines: string[] = [];
  const part = (name: keyof HostStatus['parts']): string => `${name} ${s.parts[name].state}${s.parts[name].via === 'none' ? '' : ` (${s.parts[name].via})`}`;
  lines.push(`parts:     ${(['forwarder', 'cli-proxy', 'link', 'apply'] as const).map(part).join(', ')}`);
  if (!s.enrolment.enrolled) lines.push('enrolment: not enrolled (operator-managed)');
  else {
    lines.push(`enrolment: host ${s.enrolment.hostId ?? '(unknown id)'} with ${s.enrolment.gatewayUrl ?? '(unknown Gateway)'}`);
    const l = s.link;
    if (!l) lines.push('link:      no status yet');
    else {
      const sync = l.lastSyncAt ? `last sync ${ago(Date.parse(l.lastSyncAt), now)}` : 'never synced';
      const err = l.lastError && l.state !== 'polling' ? `, last error ${l.lastError.code}` : '';
      lines.push(`link:      ${l.running ? l.state : `not running (was ${l.state})`}${err}; ${sync}`);
    }
  }
  const st = s.state;
  const applied = st.applied === null ? 'none in force' : `version ${st.applied} in force${st.appliedAt ? ` (applied ${ago(Date.parse(st.appliedAt), now)})` : ''}`;
  lines.push(`state:     ${applied}; received ${st.received ?? 'none'}`);
  if (st.rejected) lines.push(`           rejected version ${st.rejected.version ?? '(unreadable)'} ${ago(Date.parse(st.rejected.at), now)}: ${st.rejected.error}`);
  if (s.slots.length === 0) lines.push('slots:     none');
  const width = Math.max(0, ...s.slots.map((x) => x.slot.length));
  s.slots.forEach((x, i) => {
    const when = x.revoked ? 'revoked' : x.expiresAt ? `expires ${untilText(Date.parse(x.expiresAt), now)}` : 'never received a token';
    lines.push(`${i === 0 ? 'slots:     ' : '           '}${x.slot.padEnd(width)}  ${when}`);
  });
  if (s.audit || s.lastAuditUpload) {
    const last = s.lastAuditUpload ? `last upload ${ago(Date.parse(s.lastAuditUpload), now)}` : 'no upload yet';
    const spool = s.audit ? `; ${s.audit.spooled} event(s) spooled${s.audit.dropped > 0 ? `, ${s.audit.dropped} dropped (spool full)` : ''}` : '';
    lines.push(`audit:     ${last}${spool}`);
  }
  return `${lines.join('\n')}\n`;
}
