import { lstat, readFile } from 'node:fs/promises';
import { readAppliedState, appliedStatePath, type AppliedState } from '../data/applied-state.js';
import { parseCatalog, type Catalog } from '../data/catalog.js';
import { MAX_STATE_BYTES, parseDesiredState, toLocalConfig, type DesiredState } from '../data/desired-state.js';
import { handoffPaths } from '../data/handoff.js';
import { readLinkEnv } from '../data/link-env.js';
import { readLinkStatus, type LinkStatus } from '../data/link-status.js';
import { keyPrefix } from '../data/parse.js';
import { CREDENTIAL_UNUSABLE, rejectionPending, STATE_REJECTED } from '../data/problem-codes.js';
import { parseInstancesFile, type InstancesFile } from '../data/registry.js';
import type { StateLayout } from '../data/state-layout.js';
import { APPLY_UNIT, LINK_UNIT } from '../data/unit-names.js';
import { readBoundedText } from '../fs/bounded-read.js';
import { processAlive } from '../fs/process-alive.js';
import { ago, type Findings } from './finding.js';

/**
 * doctor's checks of an enrolled host (SPEC §8): enrolment, the link's state (from the
 * status file the link keeps), the desired-state version received vs applied, and drift
 * (a hand edit of instances.json or providers.json on a host the platform manages). A
 * host that was never enrolled gets none of these, so its report is what it always was.
 */

/** Backing off longer than this is a problem, not a passing hiccup. */
export const BACKOFF_PROBLEM_MS = 5 * 60_000;

/** Makes apply write the version it has again: the registry, the catalog, every slot. */
export function reapplyFix(handoffDir: string): string {
  return `rm ${appliedStatePath(handoffDir)} && systemctl restart ${APPLY_UNIT}`;
}

export interface Enrolment {
  enrolled: boolean;
  gatewayUrl?: string;
  hostId?: string;
}

export async function readEnrolment(credentialPath: string): Promise<Enrolment> {
  // lstat, not read: the credential is a secret and doctor has no use for its content.
  const enrolled = await lstat(credentialPath).then(
    () => true,
    (err: NodeJS.ErrnoException) => err.code !== 'ENOENT',
  );
  if (!enrolled) return { enrolled };
  const env = (await readLinkEnv(credentialPath)) ?? {};
  return { enrolled, ...env };
}

export type Received = { kind: 'none' } | { kind: 'invalid'; version: number | null } | { kind: 'ok'; state: DesiredState };

/** The desired state the link last handed over (`<handoff>/desired-state.json`). */
export async function readReceived(handoffDir: string): Promise<Received> {
  // The link's file, read as root: bounded by the state's own limit, never through a FIFO.
  const text = await readBoundedText(handoffPaths(handoffDir).desiredState, MAX_STATE_BYTES).catch(() => undefined);
  if (text === undefined) return { kind: 'none' };
  const parsed = parseDesiredState(text);
  if (parsed.ok) return { kind: 'ok', state: parsed.value };
  let version: number | null = null;
  try {
    const v: unknown = (JSON.parse(text) as { version?: unknown } | null)?.version;
    if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) version = v;
  } catch {
    // not JSON: no version to report
  }
  return { kind: 'invalid', version };
}

export interface LinkCheckOptions {
  credentialPath: string;
  handoffDir: string;
  layout: Pick<StateLayout, 'instances' | 'providers' | 'instanceToken' | 'providerToken'>;
  now: number;
}

export interface LinkFacts {
  enrolment: Enrolment;
  link?: LinkStatus;
  applied?: AppliedState;
  received: Received;
}

export async function linkChecks(o: LinkCheckOptions, out: Findings): Promise<LinkFacts> {
  const enrolment = await readEnrolment(o.credentialPath);
  const received = await readReceived(o.handoffDir);
  if (!enrolment.enrolled) return { enrolment, received };
  const reenrol = `agent-connectors enroll --gateway ${enrolment.gatewayUrl ?? '<Gateway URL>'} --force`;

  if (enrolment.gatewayUrl && enrolment.hostId) out.ok('enrolment', `enrolled as host ${enrolment.hostId} with the Gateway ${enrolment.gatewayUrl}`);
  else out.problem('link_env_missing', 'enrolment', `the host credential ${o.credentialPath} exists but link.env beside it names no Gateway URL or host id: the link runs renewals only`, reenrol);

  const link = await linkStateCheck(o, enrolment, reenrol, out);
  const applied = await readAppliedState(o.handoffDir);
  versionCheck(o, received, applied, out);
  await driftCheck(o, received, applied, out);
  return { enrolment, received, ...(link ? { link } : {}), ...(applied ? { applied } : {}) };
}

async function linkStateCheck(o: LinkCheckOptions, enrolment: Enrolment, reenrol: string, out: Findings): Promise<LinkStatus | undefined> {
  const read = await readLinkStatus(o.handoffDir);
  const logs = `journalctl -u ${LINK_UNIT}`;
  if (read.kind === 'absent') {
    out.problem('link_not_running', 'link', 'the link has never reported its state here (link-status.json is missing): it is not running, or not as an enrolled link', `systemctl restart ${LINK_UNIT}; ${logs}`);
    return undefined;
  }
  if (read.kind === 'invalid') {
    out.problem('link_status_invalid', 'link', `link-status.json is invalid: ${read.error}`, `systemctl restart ${LINK_UNIT}`);
    return undefined;
  }
  const s = read.status;
  const now = o.now;
  const sync = s.lastSyncAt ? `last sync ${s.lastSyncAt} (${ago(Date.parse(s.lastSyncAt), now)})` : 'never synced';
  const lastError = s.lastError ? `last error ${s.lastError.code} (${s.lastError.detail}) at ${s.lastError.at}` : 'no error';
  if (!processAlive(s.pid)) {
    out.problem('link_not_running', 'link', `the link (pid ${s.pid}) is not running; its last state was ${s.state} at ${s.updatedAt}, ${sync}`, `systemctl restart ${LINK_UNIT}; ${logs}`);
    return s;
  }
  switch (s.state) {
    case 'polling':
      out.ok('link', `polling ${enrolment.gatewayUrl ?? 'the Gateway'} (pid ${s.pid}); ${sync}`);
      break;
    case 'backing_off': {
      const detail = `backing off since ${s.since}: ${lastError}; ${sync}`;
      if (now - Date.parse(s.since) > BACKOFF_PROBLEM_MS) out.problem('link_backing_off', 'link', detail, logs);
      else out.warn('link_backing_off', 'link', detail, logs);
      break;
    }
    case 'halted':
      out.problem('link_halted', 'link', `halted on 401 since ${s.since}: the Gateway refused the host credential, so the link stopped polling and reporting presence; ${sync}. Re-enrol with ${reenrol} (a new pairing code from the platform)`, reenrol);
      break;
    case 'credential_unusable':
      out.problem(CREDENTIAL_UNUSABLE, 'link', `the host credential ${o.credentialPath} cannot be used (${s.lastError?.detail ?? 'unknown'}) since ${s.since}; ${sync}`, reenrol);
      break;
  }
  return s;
}

function versionCheck(o: LinkCheckOptions, received: Received, applied: AppliedState | undefined, out: Findings): void {
  const inForce = applied && applied.appliedAt !== null ? applied.version : null;
  const applyLogs = `journalctl -u ${APPLY_UNIT}`;
  if (applied && rejectionPending(applied)) {
    const r = applied.rejected;
    out.problem(
      STATE_REJECTED,
      'desired state',
      `version ${r?.version ?? '(unreadable)'} was rejected at ${r?.at}: ${r?.error}; ${inForce === null ? 'no version is in force' : `version ${inForce} stays in force`}`,
      `the platform must send a valid state (the host keeps the last good one); ${applyLogs}`,
    );
    return;
  }
  const receivedVersion = received.kind === 'ok' ? received.state.version : received.kind === 'invalid' ? received.version : null;
  if (received.kind === 'none') {
    out.warn('state_not_received', 'desired state', 'no desired state received from the Gateway yet', `journalctl -u ${LINK_UNIT}`);
    return;
  }
  if (inForce === null || (receivedVersion !== null && receivedVersion > inForce)) {
    out.warn('state_not_applied', 'desired state', `version ${receivedVersion ?? '(unreadable)'} received, ${inForce === null ? 'none' : `version ${inForce}`} in force: apply has not applied it (yet)`, `systemctl status ${APPLY_UNIT}; ${applyLogs}`);
    return;
  }
  out.ok('desired state', `version ${inForce} in force since ${applied?.appliedAt}; received ${receivedVersion ?? '(unreadable)'}`);
}

/** One file's entries that differ from what the applied state makes of it, named without secrets. */
function differences<T extends Record<string, object>>(actual: T, expected: T, name: (key: string, entry: object) => string): string[] {
  const out: string[] = [];
  for (const key of Object.keys(expected).sort()) {
    const want = expected[key] as Record<string, unknown>;
    const have = actual[key] as Record<string, unknown> | undefined;
    if (!have) {
      out.push(`${name(key, want)} missing`);
      continue;
    }
    const fields = [...new Set([...Object.keys(want), ...Object.keys(have)])].filter((f) => JSON.stringify(want[f]) !== JSON.stringify(have[f]));
    if (fields.length) out.push(`${name(key, want)} changed (${fields.sort().join(', ')})`);
  }
  for (const key of Object.keys(actual).sort()) if (!(key in expected)) out.push(`${name(key, actual[key] as object)} added by hand`);
  return out;
}

async function driftCheck(o: LinkCheckOptions, received: Received, applied: AppliedState | undefined, out: Findings): Promise<void> {
  if (!applied || applied.appliedAt === null) return;
  if (received.kind !== 'ok' || received.state.version !== applied.version) {
    out.warn('drift_unchecked', 'drift', `not checked: desired-state.json no longer holds version ${applied.version}, the one in force`);
    return;
  }
  const expected = toLocalConfig(received.state, o.layout);
  const reapply = `undo the edit, or have apply write it again: ${reapplyFix(o.handoffDir)}`;
  const files: Array<[string, (t: string) => { ok: true; value: Record<string, object> } | { ok: false; error: string }, Record<string, object>, (k: string, e: object) => string]> = [
    // Binding ids are capabilities: shown by their prefix, with the (non-secret) instance id.
    [o.layout.instances, parseInstancesFile, expected.instances, (k, e) => `binding ${keyPrefix(k)} (instance ${(e as InstancesFile[string]).instanceId})`],
    [o.layout.providers, parseCatalog, expected.catalog, (k) => `provider ${k}`],
  ];
  let clean = true;
  for (const [path, parse, want, name] of files) {
    const text = await readFile(path, 'utf8').catch(() => undefined);
    const parsed = text === undefined ? { ok: true as const, value: {} } : parse(text);
    if (!parsed.ok) {
      clean = false;
      out.problem('drift', 'drift', `${path} is not what desired state version ${applied.version} makes of it: it is invalid`, reapply);
      continue;
    }
    const diff = differences(parsed.value as InstancesFile | Catalog, want as InstancesFile | Catalog, name);
    if (diff.length) {
      clean = false;
      out.problem('drift', 'drift', `${path} differs from desired state version ${applied.version}: ${diff.join('; ')}`, reapply);
    }
  }
  if (clean) out.ok('drift', `${o.layout.instances} and ${o.layout.providers} are what desired state version ${applied.version} makes of them`);
}
