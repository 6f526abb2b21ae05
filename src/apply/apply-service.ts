import { basename, join } from 'node:path';
import { checkWritableDir } from '../fs/atomic-write.js';
import { watchDir } from '../fs/dir-watch.js';
import { UnsafeDirError } from '../fs/own-dir.js';
import type { ApplyMetrics } from '../metrics/renewal-metrics.js';
import { runLoop } from '../service/loop.js';
import type { Service } from '../service/service.js';
import { existsSync, lstatSync } from 'node:fs';
import { HOST_REVOKED_FILE, hostRevokedPath } from '../data/host-revoked.js';
import type { StateLayout } from '../data/state-layout.js';
import type { TokenLayout } from '../data/token-path.js';
import { ensureHandoffDir } from './handoff-dirs.js';
import { applyInbox, INBOX_FILES_IN_FLIGHT, type ApplyDeps } from './inbox.js';
import { localConfigFiles } from './local-config.js';
import { reconcileDesiredState, type ReconcileDeps, type ReconcileMemo } from './reconcile.js';
import { revokeIfMarked } from './revoke.js';
import { tokenTargets } from './token-targets.js';

export interface ApplyConfig {
  watch: boolean;
  /** In watch mode, a full scan at least this often in case a file event was missed. */
  rescanMs: number;
  paths: ApplyDeps['paths'];
  /**
   * Where the registry and the catalog are (flags may move them) and the default token
   * files (whose directories are checked writable at start).
   */
  layout: Pick<StateLayout, 'instances' | 'providers' | 'forwarderDir' | 'cliProxyDir'> & Partial<Pick<StateLayout, 'audit'>> & TokenLayout;
  /**
   * Reconcile of `<handoff>/desired-state.json` (SPEC §8), with the shim renderer
   * (injected by the CLI). Without it, or without the file, apply does only what it
   * always did.
   */
  reconcile?: Pick<ReconcileDeps, 'renderShims' | 'allowedCommands' | 'reservedPorts'>;
  /** Tokens applied, ignored and rejected (`--metrics-listen`). */
  metrics?: ApplyMetrics | undefined;
}

/** How long a pass woken by a few inbox names waits for more (see `gather`). */
const GATHER_MS = 20;

/** Where apply writes token files unless a binding or the catalog names another path. */
function defaultTokenDirs(layout: Pick<StateLayout, 'forwarderDir' | 'cliProxyDir'>): string[] {
  return [layout.forwarderDir, layout.cliProxyDir];
}

/**
 * renew apply: hand-off → token file. `--watch` (inotify on inbox/) is how it runs: the
 * systemd unit, `dev`, hosts without systemd; a new token is renamed into place as soon as
 * fetch hands it over. One-shot (no --watch) applies what is there and exits, for scripts
 * and recovery. Both on the one loop, so either stops on SIGTERM, even while waiting for
 * another apply's lock.
 */
export function createApplyService(config: ApplyConfig): Service {
  return {
    name: 'apply',
    async run({ signal, log, notifier, onReload }) {
      const { paths } = config;
      await checkWritableDir(paths.root, 'the hand-off directory');
      // apply's own directories, made and checked by apply (the link may have planted a
      // symlink in their place). One refused is logged and not used; the rest still serve.
      for (const which of ['inbox', 'slots', 'rejected'] as const) {
        try {
          await ensureHandoffDir(paths, which);
        } catch (err) {
          if (!(err instanceof UnsafeDirError)) throw err;
          log.error({ reason: err.message }, 'hand-off directory refused; not used until it is apply\'s own again');
          continue;
        }
        if (which === 'inbox') await checkWritableDir(paths.inbox, 'the hand-off inbox', { probe: false });
        if (which === 'slots') await checkWritableDir(paths.slots, 'the hand-off slot files');
      }
      for (const dir of defaultTokenDirs(config.layout)) await checkWritableDir(dir, 'the token files', { mode: 0o700 });
      // Read at first use and again only when someone else changed them: what reconcile
      // writes is kept, not read back.
      const local = localConfigFiles(config.layout);
      const deps: ApplyDeps = { paths, tokenFilesFor: tokenTargets(local, config.layout), log, signal };
      const memo: ReconcileMemo = {};
      // desired-state.json (megabytes with 10 000 bindings) is read again only when it was
      // renamed in, on SIGHUP, or on the periodic rescan: not for every token in the inbox.
      let stateDirty = true;
      let lastStateCheck = 0;
      // --watch: the inbox names the watcher reported since the last round. The directory is
      // listed only at start, on an event without a name, and on the periodic rescan: a
      // listing and sort of thousands of hand-offs per wake was O(inbox) work per token.
      const inboxNames = new Set<string>();
      let listInbox = true;
      let lastListing = 0;
      // Tokens arrive one rename at a time; a pass for each paid the pass's own cost (the
      // hand-off lock, the directory checks) per token. A pass woken by inbox names alone
      // waits up to GATHER_MS for INBOX_FILES_IN_FLIGHT of them; a new desired state, a
      // listing or a stop ends the wait at once.
      let endGather: (() => void) | undefined;
      const gather = async (): Promise<void> => {
        if (stateDirty || listInbox || inboxNames.size === 0 || inboxNames.size >= INBOX_FILES_IN_FLIGHT) return;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(done, GATHER_MS);
          function done(): void {
            clearTimeout(timer);
            signal.removeEventListener('abort', done);
            endGather = undefined;
            resolve();
          }
          endGather = done;
          signal.addEventListener('abort', done, { once: true });
        });
      };
      const nextNames = (): readonly string[] | undefined => {
        if (listInbox || Date.now() - lastListing >= config.rescanMs) {
          listInbox = false;
          lastListing = Date.now();
          inboxNames.clear();
          return undefined;
        }
        const names = [...inboxNames];
        inboxNames.clear();
        return names;
      };
      const applyAll = async (): Promise<void> => {
        try {
          // The desired state first: a new slot's token arrives in the inbox after it.
          if (config.reconcile && (stateDirty || Date.now() - lastStateCheck >= config.rescanMs)) {
            stateDirty = false;
            lastStateCheck = Date.now();
            // Access ended for the whole host: the empty state, whatever desired-state.json says.
            const revoked = await revokeIfMarked({ ...config.reconcile, layout: config.layout, local, paths, log, signal, tokenDirs: defaultTokenDirs(config.layout), auditDir: config.layout.audit });
            if (revoked.kind === 'absent') await reconcileDesiredState({ ...config.reconcile, layout: config.layout, local, paths, log, signal, memo });
            // What was handled before the revocation may come back (the same state after a new
            // enrolment); the revocation rendered the shims for no catalog.
            else {
              delete memo.lastDigest;
              delete memo.shimsFor;
            }
          }
          const stats = await applyInbox({
            ...deps,
            managed: config.reconcile !== undefined && (existsSync(paths.desiredState) || existsSync(hostRevokedPath(paths.root))),
            // A new desired state ends the pass between two files: the loop runs again at
            // once (the watch woke it), reconciles, then takes the rest of the inbox.
            interrupt: config.reconcile ? () => stateDirty : undefined,
            ...(config.watch && { nextNames }),
          });
          // Names taken but not applied (the pass ended for a new desired state, a file failed)
          // are found again by listing the directory on the next pass.
          if (stats.interrupted || (stats.failed ?? 0) > 0) listInbox = true;
          if (stats.applied + stats.ignored + stats.rejected > 0) log.info(stats, 'inbox processed');
          config.metrics?.applied(stats);
        } catch (err) {
          listInbox = true;
          // Stopped while waiting for the lock: nothing half done, the next run applies.
          if (!signal.aborted) throw err;
        }
      };
      if (!config.watch) {
        await runLoop({
          name: 'apply',
          log,
          signal,
          failFast: true,
          step: async () => {
            await applyAll();
            return 'done';
          },
        });
        return;
      }
      // fetch's temp files (dot files) are 0600 until renamed: watchDir ignores them, and a
      // watch error only falls back to the periodic scan.
      let wakeLoop: (() => void) | undefined;
      const unwatchInbox = watchDir(
        paths.inbox,
        (name) => {
          if (name === undefined) listInbox = true;
          // An entry that is gone (apply's own removal or rejection, most events while
          // tokens pour in) is nothing to do and no reason to wake: one lstat instead of a
          // pass. A name reported before its file was applied and removed costs the pass a
          // failed open.
          else if (lstatSync(join(paths.inbox, name), { throwIfNoEntry: false }) === undefined) return;
          else inboxNames.add(name);
          if (name === undefined || inboxNames.size >= INBOX_FILES_IN_FLIGHT) endGather?.();
          wakeLoop?.();
        },
        (err) => log.warn({ err: { message: err.message } }, 'watching inbox/ failed; falling back to periodic scans'),
      );
      // The link renames desired-state.json (or host-revoked.json) into the hand-off root;
      // only those names wake us (apply's own applied-state.json and lock files live there too).
      const stateNames = new Set([basename(paths.desiredState), HOST_REVOKED_FILE]);
      const unwatchRoot = watchDir(
        paths.root,
        (name) => {
          if (name !== undefined && !stateNames.has(name)) return;
          stateDirty = true;
          endGather?.();
          wakeLoop?.();
        },
        (err) => log.warn({ err: { message: err.message } }, 'watching desired-state.json failed; falling back to periodic scans'),
      );
      try {
        await notifier.ready('watching inbox');
        log.info({ desiredState: config.reconcile !== undefined }, 'apply watching');
        const stopWatchdog = notifier.startWatchdog();
        try {
          await runLoop({
            name: 'apply',
            log,
            signal,
            step: async () => {
              await gather();
              await applyAll();
              return config.rescanMs;
            },
            subscribeWake: (wake) => {
              wakeLoop = wake;
              const offReload = onReload(() => {
                log.info('SIGHUP: rescanning the inbox');
                stateDirty = true;
                endGather?.();
                wake();
              });
              return () => {
                wakeLoop = undefined;
                offReload();
              };
            },
          });
        } finally {
          stopWatchdog();
        }
      } finally {
        unwatchInbox();
        unwatchRoot();
      }
    },
  };
}
