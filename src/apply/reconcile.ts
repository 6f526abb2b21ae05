import { createHash } from 'node:crypto';
import { lstat, mkdir, readdir } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { appliedStatePath, readAppliedState, type AppliedState } from '../data/applied-state.js';
import type { Catalog } from '../data/catalog.js';
import { hostToolProblem } from '../data/catalog-rules.js';
import { desiredStateVersion, MAX_STATE_BYTES, ownListenerUpstream, parseDesiredStateAfter, slotsOf, toLocalConfig, type DesiredState, type ValidatedState } from '../data/desired-state.js';
import { sameJsonValue, type ParseResult } from '../data/parse.js';
import { slotOfFileName, type HandoffPaths } from '../data/handoff.js';
import type { InstancesFile } from '../data/registry.js';
import { cliSlot, instanceSlot, parseSlotId } from '../data/renew-wire.js';
import { tokenPath, type TokenLayout } from '../data/token-path.js';
import { atomicWrite, ownerFor, sweepStaleTemps } from '../fs/atomic-write.js';
import { readBoundedRegularFile, UnsafeFileError } from '../fs/bounded-read.js';
import { withFileLock } from '../fs/file-lock.js';
import type { Logger } from '../log/logger.js';
import { crashPoint } from '../service/test-hooks.js';
import { configText } from './config-text.js';
import type { LocalConfigFiles, RememberedFile } from './local-config.js';
import { deleteFile, eachInParallel, ensureSlots, manifestSlots, retireSlot, writeManifest } from './slot-admin.js';

/**
 * apply's reconcile of `<handoff>/desired-state.json` (SPEC §8): the whole state, validated
 * as a whole, applied completely or not at all. The plan is pure (current vs desired); the
 * executor runs it in a crash-safe order:
 *   1. instances.json and providers.json, atomically, 0600: what the proxies serve (a new
 *      binding answers 503 `token_unavailable` until its token exists)
 *   2. shims re-rendered (injected: apply must not import shims/)
 *   3. the slot manifest (`slots/slots.manifest`, one atomic write: the link renews the
 *      new slots at once) naming the state's slots and, still, the ones to retire; the
 *      existing per-slot files checked (revived if revoked). A new slot gets no file of
 *      its own until it holds a token (apply's inbox writes it then)
 *   4. for what is gone: token file deleted, then the manifest written without the
 *      retired slots, then their per-slot files deleted (the manifest entry and the file
 *      are the durable reminder, so a crash in between still cleans up on the next run)
 *   5. applied-state.json
 * A crash anywhere before 5 leaves the version not in force, and the next run re-applies
 * it; every step is idempotent.
 *
 * The registry goes before the slots: the bound is the state in force (every binding
 * answering) within 2 s, and the slots only start renewals, which cannot finish before the
 * registry names the binding anyway. A crash between 1 and 3 leaves bindings in the
 * registry with no slot yet; applied-state is not written, so the next run re-applies the
 * version: the manifest is written from the desired state, and what is gone is found from
 * the per-slot files listed, the manifest's ids and the registry in force (`planReconcile`;
 * nothing is retired that the state still wants).
 *
 * The manifest replaced 11 000 empty `slots/<slot>.json` for a new 10 000-binding state
 * (docs/design/scale-handoff.md, part 1). The empty files a previous version wrote are
 * left where they are: the readers take the union, so they stay valid slots; each is
 * overwritten by the slot's next token and deleted with its slot.
 */

export interface ReconcileCurrent {
  instances: InstancesFile;
  catalog: Catalog;
  /** Slot ids in the hand-off: a per-slot file, or an entry of the manifest apply wrote. */
  slots: ReadonlySet<string>;
  /** Of those, the ones with a per-slot file (the rest need no file check). */
  slotFiles?: ReadonlySet<string>;
}

export interface ReconcilePlan {
  instances: InstancesFile;
  catalog: Catalog;
  /** Whether each file differs from what is there. */
  writeInstances: boolean;
  writeCatalog: boolean;
  /** Slots the state needs (created or revived, idempotent), sorted. */
  ensureSlots: string[];
  /** Of those, the ones not in the hand-off yet. */
  newSlots: string[];
  /** Slots (files or manifest entries) for nothing in the state. */
  retireSlots: string[];
  /** Token files nothing in the state uses any more. */
  deleteTokenFiles: string[];
}

/**
 * Whether a file needs writing: `sameJsonValue` stops at the first difference (a new or
 * dropped binding: the key counts) where stringifying both 2 MB registries did not.
 */
const sameJson = sameJsonValue;

/** The default token file of a slot (where apply wrote it when no config named one). */
function defaultTokenFile(slot: string, layout: TokenLayout): string | undefined {
  const owner = parseSlotId(slot);
  return owner && tokenPath(owner, layout);
}

/** Current vs desired → what to write, create, retire and delete. Pure. */
export function planReconcile(
  current: ReconcileCurrent,
  desired: DesiredState,
  layout: TokenLayout,
): ReconcilePlan {
  // O(n) passes without intermediate arrays: with 10 000 in force this runs for every
  // change of one binding, before the registry is written. `toLocalConfig` reuses the
  // registry entry of every unchanged binding (the same object), and apply's registry in
  // force is the one it wrote (`RememberedFile`), so an entry of the registry in force
  // that is the new registry's entry under the same id names a slot and a token file the
  // state keeps: only the entries that differ (a disconnect: one) are looked at for what
  // to retire and delete. A registry someone else wrote is all new objects: all looked at.
  const { instances, catalog } = toLocalConfig(desired, layout);
  const wanted = slotsOf(desired);
  const ensureSlots = [...wanted].sort();
  const newSlots = ensureSlots.filter((s) => !current.slots.has(s));
  const retire = new Set<string>();
  for (const s of current.slots) if (!wanted.has(s)) retire.add(s);
  const differing: InstancesFile[string][] = [];
  for (const id of Object.keys(current.instances)) {
    const b = current.instances[id]!;
    if (Object.hasOwn(instances, id) && instances[id] === b) continue;
    differing.push(b);
    const slot = instanceSlot(b.instanceId);
    if (!wanted.has(slot)) retire.add(slot);
  }
  for (const name of Object.keys(current.catalog)) {
    const slot = cliSlot(name);
    if (!wanted.has(slot)) retire.add(slot);
  }
  const retireSlots = [...retire].sort();
  // Token files the state may no longer use; then the ones it still names are struck off.
  const gone = new Set<string>();
  const consider = (file: string | undefined): void => {
    if (file !== undefined) gone.add(file);
  };
  for (const b of differing) consider(b.tokenFile);
  for (const name of Object.keys(current.catalog)) {
    const file = current.catalog[name]!.tokenFile;
    // The same provider with the same file (the catalog's entries are new objects each state).
    if (!(Object.hasOwn(catalog, name) && catalog[name]!.tokenFile === file)) consider(file);
  }
  for (const s of retireSlots) consider(defaultTokenFile(s, layout));
  if (gone.size > 0) {
    for (const b of Object.values(instances)) gone.delete(b.tokenFile);
    for (const p of Object.values(catalog)) gone.delete(p.tokenFile);
  }
  const deleteTokenFiles = [...gone].sort();
  return {
    instances,
    catalog,
    writeInstances: !sameJson(current.instances, instances),
    writeCatalog: !sameJson(current.catalog, catalog),
    ensureSlots,
    newSlots,
    retireSlots,
    deleteTokenFiles,
  };
}

export interface ReconcileDeps {
  paths: HandoffPaths;
  layout: TokenLayout;
  /** The registry and the catalog: read at start or when changed by someone else, else as apply wrote them. */
  local: LocalConfigFiles;
  /** Re-renders the shims for the catalog now in force (the CLI wires shims/ in). */
  renderShims?: (catalog: Catalog) => Promise<void>;
  /**
   * The host tools the operator allows a catalog to shim (their allowed-commands file).
   * Without it, none: a state naming one is rejected whole.
   */
  allowedCommands?: () => Promise<ReadonlySet<string>>;
  /** This host's own listener ports: a state aiming an upstream at one is rejected. */
  reservedPorts?: readonly number[] | undefined;
  log: Logger;
  now?: () => number;
  signal?: AbortSignal;
  /** What this process last did, so the next state costs what changed (see `ReconcileMemo`). */
  memo?: ReconcileMemo;
}

export interface ReconcileMemo {
  /** The digest of the last desired-state text handled, so a rescan does not redo it. */
  lastDigest?: string;
  /** The last state that validated: its unchanged entries are not validated again. */
  validated?: ValidatedState;
  /**
   * The catalog (its JSON) this process last rendered the shims for, once that catalog was
   * also the file in force: a state that changes bindings only does not read 1 000 shims.
   */
  shimsFor?: string;
}

export type ReconcileOutcome =
  | { kind: 'absent' }
  | { kind: 'unchanged' }
  | { kind: 'rejected'; version: number | null; error: string }
  | { kind: 'stale'; version: number; inForce: number }
  | { kind: 'applied'; version: number; plan: ReconcilePlan };

/** Slot ids with a per-slot file in slots/ (names only). */
export async function slotIdsPresent(paths: HandoffPaths): Promise<Set<string>> {
  const names = await readdir(paths.slots).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return [] as string[];
    throw err;
  });
  return new Set(names.flatMap((n) => slotOfFileName(n) ?? []));
}

/**
 * Every slot apply may have to retire: the per-slot files and the manifest's ids (as
 * `manifestSlots` takes them: apply's own file only). Never the slots to keep: those come
 * from the desired state.
 */
export async function slotIdsKnown(paths: HandoffPaths): Promise<{ slots: Set<string>; slotFiles: Set<string> }> {
  const slotFiles = await slotIdsPresent(paths);
  const slots = new Set(slotFiles);
  for (const slot of await manifestSlots(paths)) slots.add(slot);
  return { slots, slotFiles };
}

export async function writeAppliedState(paths: HandoffPaths, state: AppliedState): Promise<void> {
  await atomicWrite(appliedStatePath(paths.root), `${JSON.stringify(state)}\n`, { mode: 0o640 });
}

/** Writes the file and keeps what was written: the next token for a slot does not read it back. */
export async function writeConfig<T>(file: RememberedFile<T>, value: T): Promise<void> {
  const dir = dirname(file.path);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await sweepStaleTemps(dir, { target: basename(file.path) });
  file.wrote(value, await atomicWrite(file.path, configText(value), { mode: 0o600, owner: await ownerFor(dir) }));
}

/**
 * desired-state.json's text, or why it was refused unread: the link names it, so it may
 * be a symlink (to /dev/zero), a FIFO (which wedged apply, its lock held) or huge. The
 * refusal's key (what and which inode) lets a rescan skip one already reported.
 */
async function readDesiredStateText(path: string): Promise<{ text: string; unsafe?: { key: string; error: string } } | undefined> {
  try {
    return { text: (await readBoundedRegularFile(path, MAX_STATE_BYTES)).text };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    if (!(err instanceof UnsafeFileError)) throw err;
    const st = await lstat(path).catch(() => undefined);
    const error = err.reason === 'symlink' ? 'desired-state.json is a symlink' : err.reason === 'not-regular' ? 'desired-state.json is not a regular file' : `desired-state.json is larger than ${MAX_STATE_BYTES} bytes`;
    return { text: '', unsafe: { key: `${err.reason}:${st?.ino ?? 0}:${st?.size ?? 0}:${st?.mtimeMs ?? 0}`, error } };
  }
}

/**
 * The operator's allowed host tools; an allow file apply cannot use (not root's alone,
 * a bad line) allows nothing, and says so.
 */
async function allowedCommandsOf(deps: ReconcileDeps): Promise<ReadonlySet<string>> {
  if (!deps.allowedCommands) return new Set();
  try {
    return await deps.allowedCommands();
  } catch (err) {
    deps.log.error({ reason: (err as Error).message }, 'allowed-commands file refused; no host tool may be shimmed');
    return new Set();
  }
}

function withoutOwnListeners(parsed: ParseResult<DesiredState>, ports: readonly number[] | undefined): ParseResult<DesiredState> {
  const own = parsed.ok && ports ? ownListenerUpstream(parsed.value, ports) : undefined;
  return own === undefined ? parsed : { ok: false, error: own };
}

/**
 * The first look of a process at the state in force: the slot files and shims it needs
 * are written without an fsync each (`ensureSlots`, `installShims`), so one a power loss
 * took, or left empty, since the state was applied is made again here, at every start of
 * apply. Files already right are only read; a slot the Gateway revoked stays revoked
 * (only a new state revives it, as before).
 */
async function healInForce(deps: ReconcileDeps, desired: DesiredState): Promise<void> {
  const wanted = slotsOf(desired);
  const healed = (await ensureSlots(deps.paths, [...wanted].sort(), await slotIdsPresent(deps.paths), { revive: false })).written;
  if (healed.length > 0) deps.log.warn({ slots: healed.length }, 'slot files of the state in force were unreadable; written again');
  if (await writeManifest(deps.paths, wanted, desired.version)) deps.log.warn({ slots: wanted.size }, 'the slot manifest of the state in force was missing or different; written again');
  if (deps.renderShims) await renderShimsFor(deps, toLocalConfig(desired, deps.layout).catalog);
}

/**
 * The shims for `catalog`, unless this process rendered them for the same catalog and that
 * catalog is the file in force (`catalogInForce`: no write of it was needed). Another
 * writer of the catalog (a one-shot apply) makes the file differ, so its shims are
 * rendered again; a new process renders once (`healInForce`).
 */
async function renderShimsFor(deps: ReconcileDeps, catalog: Catalog, catalogInForce = false): Promise<void> {
  if (!deps.renderShims) return;
  const text = JSON.stringify(catalog);
  if (catalogInForce && deps.memo?.shimsFor === text) return;
  if (deps.memo) delete deps.memo.shimsFor;
  await deps.renderShims(catalog);
  if (deps.memo) deps.memo.shimsFor = text;
}

/** One reconcile of desired-state.json, under the hand-off lock. No file: nothing happens. */
export async function reconcileDesiredState(deps: ReconcileDeps): Promise<ReconcileOutcome> {
  const { paths, log } = deps;
  const now = deps.now ?? Date.now;
  const lock = {
    signal: deps.signal,
    onWait: (owner: number) => log.info({ owner: owner || null }, 'waiting for another apply to finish'),
  };
  return withFileLock(join(paths.root, 'apply'), async (): Promise<ReconcileOutcome> => {
    const read = await readDesiredStateText(paths.desiredState);
    if (read === undefined) return { kind: 'absent' };
    const { text, unsafe } = read;
    const digest = unsafe ? `unsafe:${unsafe.key}` : createHash('sha256').update(text).digest('hex');
    if (deps.memo?.lastDigest === digest) return { kind: 'unchanged' };
    const applied = (await readAppliedState(paths.root)) ?? { version: 0, appliedAt: null };
    const fresh = unsafe ? undefined : parseDesiredStateAfter(text, deps.memo?.validated);
    if (deps.memo && fresh?.validated) deps.memo.validated = fresh.validated;
    const parsed = withoutOwnListeners(fresh?.result ?? { ok: false as const, error: unsafe?.error ?? 'invalid' }, deps.reservedPorts);
    // The schema holds the rules every reader holds; the host-tool rule needs the
    // operator's allow file, read here, each time (it is small and rarely changes).
    const error = parsed.ok ? hostToolProblem(parsed.value.providers, await allowedCommandsOf(deps)) : parsed.error;
    if (!parsed.ok || error !== undefined) {
      const version = unsafe ? null : desiredStateVersion(text);
      const reason = error ?? 'invalid';
      await writeAppliedState(paths, { version: applied.version, appliedAt: applied.appliedAt, rejected: { version, error: reason.slice(0, 1000), at: new Date(now()).toISOString() } });
      if (deps.memo) deps.memo.lastDigest = digest;
      log.error({ version, inForce: applied.version, reason }, 'desired state rejected; the last good one stays in force');
      return { kind: 'rejected', version, error: reason };
    }
    const desired = parsed.value;
    // The same version may be in force only half applied after a crash: applied-state is
    // written last, so "in force" means complete. Equal → done; older → ignored.
    if (desired.version <= applied.version && applied.appliedAt !== null) {
      const firstLook = deps.memo?.lastDigest === undefined;
      if (deps.memo) deps.memo.lastDigest = digest;
      if (desired.version < applied.version) {
        log.warn({ version: desired.version, inForce: applied.version }, 'desired state older than the one in force; ignored');
        return { kind: 'stale', version: desired.version, inForce: applied.version };
      }
      if (firstLook) await healInForce(deps, desired);
      return { kind: 'unchanged' };
    }

    const current: ReconcileCurrent = {
      // A hand-edited file apply cannot read is replaced; its token files are then found
      // through the slot files only.
      instances: await deps.local.instances.get().catch(() => ({})),
      catalog: await deps.local.catalog.get().catch(() => ({})),
      // Names only: what exists is what may need retiring (10 000 files need not be read).
      ...(await slotIdsKnown(paths)),
    };
    const plan = planReconcile(current, desired, deps.layout);

    // 1. the registry and the catalog: what the proxies serve, first (see the order above).
    if (plan.writeInstances) await writeConfig(deps.local.instances, plan.instances);
    crashPoint('reconcile-after-registry-write');
    if (plan.writeCatalog) await writeConfig(deps.local.catalog, plan.catalog);
    crashPoint('reconcile-after-catalog-write');
    // 2. shims for the catalog now in force.
    await renderShimsFor(deps, plan.catalog, !plan.writeCatalog);
    crashPoint('reconcile-after-shims');
    // 3. the manifest: the new slots start renewals (one file, whatever their number); the
    // slots to retire stay named until their token files are gone (the reminder). The
    // per-slot files there are checked (revived if revoked).
    const wanted = new Set(plan.ensureSlots);
    const slotFiles = await ensureSlots(paths, plan.ensureSlots, current.slotFiles ?? current.slots);
    await writeManifest(paths, new Set([...plan.ensureSlots, ...plan.retireSlots]), desired.version);
    crashPoint('reconcile-after-slots');
    // 4. what is gone: token file first, then the slot (manifest entry, then its file).
    let deleted = 0;
    for (const file of plan.deleteTokenFiles) if (await deleteFile(file)) deleted += 1;
    crashPoint('reconcile-after-token-deletion');
    if (plan.retireSlots.length > 0) {
      // The manifest first: a slot whose file went first would be an empty slot (renewed
      // at once) until the manifest dropped it.
      await writeManifest(paths, wanted, desired.version);
      crashPoint('reconcile-after-manifest-retire');
    }
    await eachInParallel(plan.retireSlots, (slot) => retireSlot(paths, slot));
    // The last point before the version is in force.
    crashPoint('reconcile-after-slot-retire');
    // 5. in force.
    // A rejection of something newer than what is now in force stays on record.
    const rejected = applied.rejected && (applied.rejected.version === null || applied.rejected.version > desired.version) ? { rejected: applied.rejected } : {};
    await writeAppliedState(paths, { version: desired.version, appliedAt: new Date(now()).toISOString(), ...rejected });
    if (deps.memo) deps.memo.lastDigest = digest;
    log.info(
      {
        version: desired.version,
        bindings: Object.keys(plan.instances).length,
        providers: Object.keys(plan.catalog).length,
        newSlots: plan.newSlots.length,
        slotFilesRead: slotFiles.read,
        slotFilesLooked: slotFiles.looked,
        retiredSlots: plan.retireSlots.length,
        deletedTokenFiles: deleted,
      },
      'desired state applied',
    );
    return { kind: 'applied', version: desired.version, plan };
  }, lock);
}
