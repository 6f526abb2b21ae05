import { linkStatusPath, type LinkErrorCode, type LinkStatus } from '../data/link-status.js';
import { atomicWrite } from '../fs/atomic-write.js';
import type { Logger } from '../log/logger.js';
import type { HostCredential } from './host-credential.js';

/** What one turn of the state poll came to, as the status file records it. */
export type PollEvent =
  | { kind: 'answered'; version?: number }
  | { kind: 'failed'; code: LinkErrorCode; detail: string }
  | { kind: 'unusable'; detail: string }
  | { kind: 'halted' };

/** A burst of answers (a Gateway answering 204 at once, again and again) writes at most this often. */
const MIN_SYNC_WRITE_GAP_MS = 1_000;

/**
 * Keeps `<handoff>/link-status.json` (data/link-status.ts) for doctor and status: the
 * poll's state, the last sync and the last error. A 401 seen by presence halts the poll
 * too, so the credential's halts are recorded here as well. Never throws: a status that
 * cannot be written must not stop the link (one warning, then silence until it works).
 */
export function recordLinkStatus(handoffDir: string, credential: HostCredential, log: Logger, now: () => number = Date.now): (e: PollEvent) => void {
  const iso = (): string => new Date(now()).toISOString();
  let status: Omit<LinkStatus, 'updatedAt'> | undefined;
  let lastWrite = 0;
  let chain = Promise.resolve();
  let warned = false;

  const write = (): void => {
    const snapshot = { ...status, updatedAt: iso() };
    lastWrite = now();
    chain = chain
      .then(() => atomicWrite(linkStatusPath(handoffDir), `${JSON.stringify(snapshot)}\n`, { mode: 0o640 }))
      .then(
        () => void (warned = false),
        (err: NodeJS.ErrnoException) => {
          if (!warned) log.warn({ err: { code: err.code } }, 'could not write link-status.json; doctor will not see the link state');
          warned = true;
        },
      );
  };

  const record = (e: PollEvent): void => {
    const at = iso();
    const state = e.kind === 'answered' ? 'polling' : e.kind === 'failed' ? 'backing_off' : e.kind === 'halted' ? 'halted' : 'credential_unusable';
    const prev = status;
    const lastError =
      e.kind === 'failed'
        ? { code: e.code, detail: e.detail.slice(0, 500), at }
        : e.kind === 'halted'
          ? { code: 'credential_rejected' as const, detail: 'the Gateway answered 401', at }
          : e.kind === 'unusable'
            ? { code: 'credential_unusable' as const, detail: e.detail.slice(0, 500), at }
            : (prev?.lastError ?? null);
    status = {
      pid: process.pid,
      state,
      since: prev?.state === state ? prev.since : at,
      lastSyncAt: e.kind === 'answered' ? at : (prev?.lastSyncAt ?? null),
      receivedVersion: e.kind === 'answered' && e.version !== undefined ? e.version : (prev?.receivedVersion ?? null),
      lastError,
    };
    const quietSync = e.kind === 'answered' && e.version === undefined && prev?.state === 'polling' && now() - lastWrite < MIN_SYNC_WRITE_GAP_MS;
    const sameProblem = e.kind !== 'answered' && prev?.state === state && prev.lastError?.code === lastError?.code && now() - lastWrite < MIN_SYNC_WRITE_GAP_MS;
    if (!quietSync && !sameProblem) write();
  };

  credential.onChange(() => {
    if (credential.halted) record({ kind: 'halted' });
  });
  return record;
}
