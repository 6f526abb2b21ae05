import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { FetchIncompleteError } from '../../errors.js';
import { checkWritableDir, sweepStaleTemps } from '../../fs/atomic-write.js';
import { watchDir } from '../../fs/dir-watch.js';
import { SlotCache } from '../../data/slot-cache.js';
import type { Logger } from '../../log/logger.js';
import type { RenewalMetrics } from '../../metrics/renewal-metrics.js';
import { runLoop } from '../../service/loop.js';
import type { Service } from '../../service/service.js';
import { RenewalState } from './renewal-state.js';
import { renewSlot, type RenewDeps, type RenewOutcome } from './renew-slot.js';
import type { HostCredential } from '../host-credential.js';
import { handoffPaths, slotFileName, slotOfFileName, type SlotFile } from '../../data/handoff.js';
import {
  afterCredentialChange,
  decide,
  dueAt,
  freshSlot,
  type Decision,
  type SlotPolicyState,
} from './policy.js';
import { defaultBackoff, type BackoffOptions } from './schedule.js';
import { RenewPool } from './renew-pool.js';

export interface RenewalConfig {
  handoffDir: string;
  privateDir: string;
  /** One pass for a timer: settle every due slot (retrying within the budget), then exit. */
  once: boolean;
  onceBudgetMs: number;
  backoff: BackoffOptions;
  /** Longest sleep between scans even when nothing is due (catches missed file events). */
  maxSleepMs: number;
  /**
   * The most renewal requests in flight at once, each for a different slot: the bound that
   * keeps one host from storming the Gateway (it adapts below it, renew-pool.ts).
   */
  concurrency: number;
  /** Iterations, failures, durations and each slot's token expiry (`--metrics-listen`). */
  metrics?: RenewalMetrics | undefined;
}

/**
 * The most renewals in flight (renew-pool.ts lowers it while the Gateway sheds load). One at
 * a time, 10 000 new bindings waited minutes for their tokens; it stayed 1 while apply took
 * its inbox one file at a time and a faster link only lengthened the pass a disconnect
 * waited behind. apply now takes 32 inbox files at once and stops between two for a new
 * desired state (docs/host-link.md, "Renewal at scale").
 */
export const DEFAULT_RENEW_CONCURRENCY = 32;

export const defaultRenewalConfig = { once: false, onceBudgetMs: 120_000, backoff: defaultBackoff, maxSleepMs: 60_000, concurrency: DEFAULT_RENEW_CONCURRENCY };

/** The log line of each decision (the policy decides; this only reports). */
function logDecision(log: Logger, slot: string, outcome: RenewOutcome, decision: Extract<Decision, { kind: 'next' }>): void {
  switch (outcome.kind) {
    case 'renewed':
      log.info({ slot, tokenId: outcome.tokenId, expiresAt: outcome.expiresAt }, 'renewed; handed to apply');
      return;
    case 'conflict':
      log.warn({ slot, currentTokenId: outcome.currentTokenId, attempt: decision.state.attempt }, "token conflict (409): adopted the Gateway's token id; renewing again");
      return;
    case 'revoked':
      log.warn({ slot }, 'slot revoked by the Gateway (404); no more renewals for it');
      return;
    case 'retry':
      log.warn(
        { slot, reason: outcome.reason, attempt: decision.state.attempt, retryInMs: decision.delayMs, retryAfterMs: outcome.retryAfterMs },
        'renewal failed; will retry with the same requestId',
      );
      return;
    case 'credential_invalid':
      return;
  }
}

/**
 * The link's renewal: schedule → renew → hand-off, with the policy deciding each next
 * attempt. Sends with the host credential and obeys its one stop switch (a 401 here halts
 * the whole link, and a 401 elsewhere halts renewal); it never sees a token file, only the
 * hand-off directory and its private state.
 */
export function createRenewalService(config: RenewalConfig, credential: HostCredential, hooks: { onPruned?: () => void } = {}): Service {
  return {
    name: 'link-renewal',
    async run({ signal, log, notifier, onReload }) {
      const paths = handoffPaths(config.handoffDir);
      const state = new RenewalState(join(config.privateDir, 'slots'));
      await checkWritableDir(paths.inbox, 'the hand-off inbox', { probe: false });
      await checkWritableDir(state.dir, "the link's private state", { mode: 0o700 });
      // A fetch killed mid-write leaves its temp file (part of an answer, maybe part of a
      // token); apply ignores dot files, so fetch, their only writer, sweeps its own.
      for (const dir of [paths.inbox, state.dir]) {
        for (const file of await sweepStaleTemps(dir)) log.info({ file }, 'removed a temp file left by an interrupted write');
      }
      const restored = state.recover();
      if (restored.length > 0) log.warn({ slots: restored.length }, 'pending requestIds a lost record had forgotten restored from the journal; their retries reuse them');
      const renewDeps: RenewDeps = { paths, state, credential, log, signal };
      const slotStates = new Map<string, SlotPolicyState>();
      // Slot files re-read only where the watcher saw a change (full rescan at least every maxSleepMs).
      const slotCache = new SlotCache(paths, config.maxSleepMs);
      /** Slots seen at the last scan: one gone since was retired (SPEC §8 reconcile). */
      let seen = new Set<string>();
      let unsettled = 0;
      let unusableLogged = false;

      // A record whose slot file is gone was retired while no link ran (a host revocation,
      // unenroll): kept, the slot created again would look already delivered and wait out
      // the old token's schedule. Pruned before the state poll starts (`onPruned`), which
      // is what can bring the slot back.
      for (const slot of await state.recorded()) if (!existsSync(join(paths.slots, slotFileName(slot)))) await state.forget(slot);
      hooks.onPruned?.();
      // A resume after a halt (of any part of the link): the failures' backoff was possibly
      // the refused credential's doing, so it is forgotten.
      const offResume = credential.onChange(() => {
        if (credential.halted) {
          // The refused credential's requestIds and deliveries mean nothing to the next one
          // (a new enrolment), and apply deletes every slot of a revoked host.
          slotStates.clear();
          void state.recorded().then((slots) => Promise.all(slots.map((s) => state.forget(s))));
          return;
        }
        log.info('host credential changed; resuming renewals');
        for (const [slot, st] of slotStates) slotStates.set(slot, afterCredentialChange(st));
      });

      const pool = new RenewPool({ max: config.concurrency });
      /** Renewals in flight, by slot: one whose slot is retired meanwhile is cut (renewSlot's signal). */
      const inFlight = new Map<string, AbortController>();

      /** Renews a due slot (its place in the pool taken); the time of its next attempt, or 'halt'. */
      const attempt = async (slot: SlotFile, token: string): Promise<number | 'halt'> => {
        const current = slotStates.get(slot.slot) ?? freshSlot;
        const cut = new AbortController();
        inFlight.set(slot.slot, cut);
        const started = performance.now();
        let outcome: RenewOutcome | undefined;
        try {
          outcome = await renewSlot({ ...renewDeps, signal: AbortSignal.any([signal, cut.signal]) }, slot, token);
        } finally {
          inFlight.delete(slot.slot);
          const latencyMs = performance.now() - started;
          const retry = outcome?.kind === 'retry' ? outcome : undefined;
          pool.release({
            // A network failure or a 429/5xx is the Gateway (or the path to it) struggling; an
            // invalid answer or a request cut here is not.
            overloaded: retry !== undefined && !cut.signal.aborted && (retry.status === undefined ? retry.reason.startsWith('network') : retry.status === 429 || retry.status >= 500),
            retryAfterMs: retry?.retryAfterMs,
            latencyMs,
          });
        }
        config.metrics?.iteration(outcome.kind, (performance.now() - started) / 1000);
        // From when the answer arrived (RFC 9110 Retry-After), not from the step's start.
        const decision = decide(current, outcome, Date.now(), { backoff: config.backoff });
        if (decision.kind === 'halt') return 'halt';
        slotStates.set(slot.slot, decision.state);
        logDecision(log, slot.slot, outcome, decision);
        return decision.at;
      };

      const step = async (): Promise<number> => {
        const now = Date.now();
        const read = credential.read();
        if (read.kind === 'halted') {
          void notifier.status('halted: host credential rejected (401)');
          return config.maxSleepMs;
        }
        if (read.kind === 'unusable') {
          if (!unusableLogged) log.error({ path: credential.path, problem: read.reason }, 'host credential unusable; renewals wait for it');
          unusableLogged = true;
          unsettled = 1;
          return config.maxSleepMs;
        }
        unusableLogged = false;
        const { slots, errors } = await slotCache.current(now);
        for (const e of errors) log.warn(e, 'ignoring invalid slot file');
        // A retired slot's memory must not outlive it: connected again, its new slot file
        // (generation 0) would look already delivered and wait out the old token's schedule.
        // Gone means no file at all (by name): a file unreadable for a moment is still there.
        const present = slotCache.present();
        for (const gone of [...seen].filter((s) => !present.has(s))) {
          slotStates.delete(gone);
          await state.forget(gone);
        }
        seen = present;
        let next = now + config.maxSleepMs;
        unsettled = 0;
        for (const slot of slots) {
          // The token in force is the one apply wrote, so the slot file tells its expiry.
          if (slot.revoked) config.metrics?.forget(slot.slot);
          else if (slot.expiresAt) config.metrics?.expiry(slot.slot, slot.expiresAt);
        }
        // Bounded, adaptive concurrency across slots (renew-pool.ts); one slot is attempted at
        // most once per step, so its requestId, backoff and order of attempts are exactly as
        // when run one by one.
        let halted: string | undefined; // the slot whose renewal met the 401
        let failure: { err: unknown } | undefined;
        const running = new Set<Promise<void>>();
        for (const slot of slots) {
          if (signal.aborted || halted !== undefined || failure) break;
          if (slot.revoked) continue;
          const current = slotStates.get(slot.slot) ?? freshSlot;
          // Not due: no place taken (a scan of 10 000 settled slots starts nothing).
          const due = dueAt(slot, state.readSync(slot.slot), current);
          if (due > Date.now()) {
            if (!current.settled) unsettled += 1;
            next = Math.min(next, due);
            continue;
          }
          if (!(await pool.acquire(signal))) break;
          if (halted !== undefined || failure || !existsSync(join(paths.slots, slotFileName(slot.slot)))) {
            // Halted, failed or retired while this slot waited for its place.
            pool.release({ overloaded: false, latencyMs: 0 });
            if (halted !== undefined || failure) break;
            continue;
          }
          const run = attempt(slot, read.credential)
            .then((at) => {
              if (at === 'halt') {
                halted ??= slot.slot;
                return;
              }
              if (!(slotStates.get(slot.slot) ?? freshSlot).settled) unsettled += 1;
              next = Math.min(next, at);
            })
            .catch((err: unknown) => {
              failure ??= { err };
            })
            .finally(() => running.delete(run));
          running.add(run);
        }
        await Promise.all(running);
        if (failure) throw failure.err;
        if (halted !== undefined) {
          // The credential logged the halt once for the whole link.
          unsettled += 1;
          log.warn({ slot: halted }, 'renewals halted with the link');
          void notifier.status('halted: host credential rejected (401)');
          return config.maxSleepMs;
        }
        void notifier.status(`${slots.length} slot(s); next renewal in ${Math.max(0, Math.round((next - Date.now()) / 1000))} s`);
        return Math.max(0, next - Date.now());
      };

      const rescanOnReload = (wake: () => void): (() => void) =>
        onReload(() => {
          log.info('SIGHUP: rescanning slots and the credential');
          slotCache.changed();
          wake();
        });

      try {
        if (config.once) {
          const deadline = Date.now() + config.onceBudgetMs;
          await runLoop({
            name: 'link-renewal',
            log,
            signal,
            failFast: true,
            subscribeWake: rescanOnReload,
            step: async () => {
              const wait = await step();
              if (credential.halted || (unsettled === 0 && wait > 0) || Date.now() + wait > deadline) return 'done';
              return wait;
            },
          });
          if (signal.aborted) {
            // Stopped (systemd stop, Ctrl-C): not a failure; a pending requestId is durable
            // and the next run continues the same renewal.
            if (unsettled > 0) log.warn({ unsettled }, 'stopped before every renewal settled; the next run continues them');
            return;
          }
          if (credential.halted || unsettled > 0) {
            throw new FetchIncompleteError(credential.halted ? 'host credential rejected (401)' : 'some renewals did not settle; see the log');
          }
          return;
        }
        await notifier.ready('renewing');
        let wakeLoop: (() => void) | undefined;
        const unwatch = watchDir(
          paths.slots,
          (name) => {
            slotCache.changed(name);
            // A slot retired (its binding disconnected, the host revoked) while its renewal is
            // in flight: the answer would only be dropped by apply, so the request is cut now.
            const slot = name === undefined ? undefined : slotOfFileName(name);
            const cut = slot === undefined ? undefined : inFlight.get(slot);
            if (cut && slot !== undefined && !existsSync(join(paths.slots, slotFileName(slot)))) cut.abort();
            wakeLoop?.();
          },
          (err) => log.warn({ err: { message: err.message } }, 'watching slots/ failed; falling back to periodic scans'),
        );
        try {
          await runLoop({
            name: 'link-renewal',
            log,
            signal,
            step,
            subscribeWake: (wake) => {
              wakeLoop = wake;
              const offReload = rescanOnReload(wake);
              const offCred = credential.onChange(wake);
              return () => {
                wakeLoop = undefined;
                offReload();
                offCred();
              };
            },
          });
        } finally {
          unwatch();
        }
      } finally {
        pool.close();
        offResume();
      }
    },
  };
}
