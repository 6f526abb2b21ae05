import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { readAppliedState } from '../data/applied-state.js';
import { DROPPED_FILE, listAuditSpool } from '../data/audit-event.js';
import type { DesiredState } from '../data/desired-state.js';
import { isBatchFileName, slotOfFileName } from '../data/handoff.js';
import { readHostRevoked, type HostRevoked } from '../data/host-revoked.js';
import { withFileLock } from '../fs/file-lock.js';
import { planReconcile, slotIdsKnown, writeAppliedState, writeConfig, type ReconcileDeps } from './reconcile.js';
import { deleteFile, eachInParallel, removeManifest, retireSlot } from './slot-admin.js';

export interface RevokeDeps extends Omit<ReconcileDeps, 'memo'> {
  /** The default token directories: swept of every `*.token`, whatever the registry named. */
  tokenDirs: readonly string[];
  /** The native_cli audit spool: its events are deleted with the host's access (docs/host-link.md). */
  auditDir?: string | undefined;
}

export type RevokeOutcome = { kind: 'absent' } | { kind: 'unchanged' } | { kind: 'revoked'; marker: HostRevoked; deletedTokenFiles: number; retiredSlots: number; droppedAuditEvents: number };

const EMPTY: DesiredState = { version: 0, bindings: {}, providers: {} };

async function namesIn(dir: string): Promise<string[]> {
  return readdir(dir).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return [] as string[];
    throw err;
  });
}

/**
 * Access ended for the whole host (`<handoff>/host-revoked.json`, data/host-revoked.ts):
 * apply, under the lock reconcile takes, applies the empty state at once. Token files go
 * first (the secrets; a proxy then answers 503 until it reloads its config, then 404),
 * then the registry and catalog, the shims, every slot (the link renews nothing), the
 * inbox (a renewal that was in flight) and the audit spool; applied-state.json last,
 * with the marker it acted on and version 0, so a new enrolment's first state applies
 * whatever its version. A crash before that leaves the marker not acted on and the next
 * run does it all again (every step idempotent). Once acted on, the same marker changes
 * nothing more: an operator who unenrolled may bind by hand.
 */
export async function revokeIfMarked(deps: RevokeDeps): Promise<RevokeOutcome> {
  const { paths, log } = deps;
  const now = deps.now ?? Date.now;
  return withFileLock(join(paths.root, 'apply'), async (): Promise<RevokeOutcome> => {
    const marker = await readHostRevoked(paths.root);
    if (!marker) return { kind: 'absent' };
    const applied = await readAppliedState(paths.root);
    if (applied?.hostRevoked?.at === marker.at && applied.hostRevoked.by === marker.by) return { kind: 'unchanged' };

    const current = {
      instances: await deps.local.instances.get().catch(() => ({})),
      catalog: await deps.local.catalog.get().catch(() => ({})),
      ...(await slotIdsKnown(paths)),
    };
    const plan = planReconcile(current, EMPTY, deps.layout);
    const swept = (await Promise.all(deps.tokenDirs.map(async (dir) => (await namesIn(dir)).filter((n) => n.endsWith('.token')).map((n) => join(dir, n))))).flat();
    let deletedTokenFiles = 0;
    for (const file of new Set([...plan.deleteTokenFiles, ...swept])) if (await deleteFile(file)) deletedTokenFiles += 1;
    if (plan.writeInstances) await writeConfig(deps.local.instances, plan.instances);
    if (plan.writeCatalog) await writeConfig(deps.local.catalog, plan.catalog);
    if (deps.renderShims) await deps.renderShims(plan.catalog);
    // The manifest first (a slot whose file went first would be an empty slot in it).
    await removeManifest(paths);
    await eachInParallel(plan.retireSlots, (slot) => retireSlot(paths, slot));
    // Tokens a renewal handed over before the link stopped: never written now. Both shapes
    // the link writes: one answer per slot, and its group commit (a batch of answers).
    for (const name of await namesIn(paths.inbox)) if (slotOfFileName(name) || isBatchFileName(name)) await deleteFile(join(paths.inbox, name));
    let droppedAuditEvents = 0;
    if (deps.auditDir) {
      for (const name of await listAuditSpool(deps.auditDir)) if (await deleteFile(join(deps.auditDir, name))) droppedAuditEvents += 1;
      await deleteFile(join(deps.auditDir, DROPPED_FILE));
    }
    await writeAppliedState(paths, { version: 0, appliedAt: new Date(now()).toISOString(), hostRevoked: marker });
    log.warn(
      { by: marker.by, at: marker.at, deletedTokenFiles, retiredSlots: plan.retireSlots.length, droppedAuditEvents },
      'host access revoked: every token file, shim and slot removed; this host serves nothing until it is enrolled again',
    );
    return { kind: 'revoked', marker, deletedTokenFiles, retiredSlots: plan.retireSlots.length, droppedAuditEvents };
  }, { signal: deps.signal, onWait: (owner: number) => log.info({ owner: owner || null }, 'waiting for another apply to finish') });
}
