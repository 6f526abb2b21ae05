import type { AgentUsersHealth } from './agent-users.js';
import type { AppliedState } from './applied-state.js';

/**
 * The problem codes the link's presence sends to the platform and `doctor` prints to the
 * operator (SPEC §8): one place for the names, so both sides of the same host say the same
 * thing. Codes are snake_case and stable; a new one may be added, none renamed.
 */

export type PartHealth = 'ok' | 'degraded' | 'down';

/** `forwarder` down → `forwarder_down`; `cli-proxy` degraded → `cli_proxy_degraded`; ok → none. */
export function partProblem(part: string, health: PartHealth): string | undefined {
  return health === 'ok' ? undefined : `${part.replaceAll('-', '_')}_${health}`;
}

export const STATE_REJECTED = 'state_rejected';
export const SLOT_FILE_INVALID = 'slot_file_invalid';
export const CREDENTIAL_UNUSABLE = 'credential_unusable';
/** The agent-users file is missing or names nobody: every agent gets 403 from both proxies. */
export const AGENT_USERS_EMPTY = 'agent_users_empty';
/** The agent-users file does not parse: the proxies keep their last good list (none, at their start). */
export const AGENT_USERS_INVALID = 'agent_users_invalid';
/** doctor only: access ended for the whole host (a 401 to its credential, or unenroll); it serves nothing until enrolled again. */
export const HOST_REVOKED = 'host_revoked';
/** doctor only: the audit spool is at its bound, so each CLI call drops the oldest event. */
export const AUDIT_SPOOL_FULL = 'audit_spool_full';
/** doctor only: events wait and nothing reached the Gateway for longer than a backoff could explain. */
export const AUDIT_UPLOAD_STALE = 'audit_upload_stale';
/** doctor only: the spool lacks the setgid bit (made by a process, not tmpfiles), so the link may not read new events. */
export const AUDIT_DIR_NOT_SETGID = 'audit_dir_not_setgid';
/** doctor only: the CLI CA (TLS mode, SPEC §10) is not there yet: the cli-proxy makes it at its start. */
export const CLI_CA_MISSING = 'cli_ca_missing';
/** doctor only: the CLI CA's key file is not a 0600 file of the cli-proxy's user: its key may be known; the cli-proxy refuses it. */
export const CLI_CA_KEY_EXPOSED = 'cli_ca_key_exposed';
/** doctor only: the CLI CA's certificate is missing, unreadable, expired, near its end, or not a CA. */
export const CLI_CA_CERT_INVALID = 'cli_ca_cert_invalid';
/** doctor only: the CLI CA ends within 30 days (the cli-proxy replaces it at its next start). */
export const CLI_CA_EXPIRING = 'cli_ca_expiring';
/** doctor only: the shims' CA bundle is missing or does not hold the CLI CA: TLS-mode CLIs fail their handshake. */
export const CA_BUNDLE_STALE = 'ca_bundle_stale';
/** doctor only: the shims' CA bundle is not readable by every agent (file 0644, directories traversable). */
export const CA_BUNDLE_UNREADABLE = 'ca_bundle_unreadable';

/** Whether apply's record holds a rejection newer than the version in force (an older one was superseded). */
export function rejectionPending(applied: AppliedState | undefined): boolean {
  return Boolean(applied?.rejected && (applied.rejected.version === null || applied.rejected.version > applied.version));
}

/** The problem codes of one presence report, in a fixed order. */
export function presenceProblems(input: {
  parts: Record<string, PartHealth>;
  applied: AppliedState | undefined;
  slotFileErrors: number;
  credentialUsable: boolean;
  /** Undefined: not checked. */
  agentUsers?: AgentUsersHealth | undefined;
}): string[] {
  const problems = Object.entries(input.parts).flatMap(([part, health]) => partProblem(part, health) ?? []);
  if (rejectionPending(input.applied)) problems.push(STATE_REJECTED);
  if (input.slotFileErrors > 0) problems.push(SLOT_FILE_INVALID);
  if (!input.credentialUsable) problems.push(CREDENTIAL_UNUSABLE);
  const users = agentUsersProblem(input.agentUsers);
  if (users) problems.push(users);
  return problems;
}

export function agentUsersProblem(health: AgentUsersHealth | undefined): string | undefined {
  return health === 'missing' || health === 'empty' ? AGENT_USERS_EMPTY : health === 'invalid' ? AGENT_USERS_INVALID : undefined;
}
