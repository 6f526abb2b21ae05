import { join } from 'node:path';
import { FetchIncompleteError } from '../../errors.js';
import { checkWritableDir, sweepStaleTemps } from '../../fs/atomic-write.js';
import { watchDir } from '../../fs/dir-watch.js';
import { SlotCache, type SlotEntry } from '../../data/slot-cache.js';
import type { Logger } from '../../log/logger.js';
import type { RenewalMetrics } from '../../metrics/renewal-metrics.js';
import { runLoop } from '../../service/loop.js';
import type { Service } from '../../service/service.js';
import { RenewalState } from './renewal-state.js';
import { renewSlot, type RenewDeps, type RenewOutcome } from './renew-slot.js';
import type { HostCredential } from '../host-credential.js';
import { handoffPaths, SLOT_MANIFEST_FILE, slotIdsInHandoff, slotOfFileName, type SlotFile } from '../../data/handoff.js';
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
import { DueQueue } from './due-queue.js';
import { InboxBatcher } from './inbox-batcher.js';
import { crashPoint } from '../../service/test-hooks.js';

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
export function createRenewalService(config: RenewalConfig, credential: HostCredential, hooks: { onPruned?: () => void; slotCache?: SlotCache } = {}): Service {
  return {
    name: 'link-renewal',
    async run({ signal, log, notifier, onReload }) {
      const paths = handoffPaths(config.handoffDir);
      const state = new RenewalState(join(config.privateDir, 'slots'), {
        onCompactError: (err) => log.warn({ error: err instanceof Error ? err.message : String(err) }, "the renewal ledger's compaction failed; appending to its log meanwhile"),
      });
      await checkWritableDir(paths.inbox, 'the hand-off inbox', { probe: false });
      await checkWritableDir(state.dir, "the link's private state", { mode: 0o700 });
      // A fetch killed mid-write leaves its temp file (part of an answer, maybe part of a
      // token); apply ignores dot files, so fetch, their only writer, sweeps its own.
      for (const dir of [paths.inbox, state.dir]) {
        for (const file of await sweepStaleTemps(dir)) log.info({ file }, 'removed a temp file left by an interrupted write');
      }
      const recovered = state.recover();
      if (recovered.upgradedFiles > 0) log.info({ files: recovered.upgradedFiles, records: recovered.records }, 'per-slot renewal records folded into the ledger and removed');
      if (recovered.restored.length > 0) log.warn({ slots: recovered.restored.length }, 'pending requestIds a lost record had forgotten restored from the journal; their retries reuse them');
      if (recovered.skipped > 0) log.warn({ lines: recovered.skipped }, 'unreadable renewal ledger lines skipped; those slots may renew once more');
      if (recovered.torn) log.info("the renewal ledger's torn last line (an interrupted append) was cut off");
      // One batcher for every renewal of this link: answers arriving together share a file.
      const inbox = new InboxBatcher({ dir: paths.inbox, midWrite: () => crashPoint('fetch-mid-inbox-write') });
      const renewDeps: RenewDeps = { paths, state, inbox, credential, log, signal };
      const slotStates = new Map<string, SlotPolicyState>();
      /** The slots whose policy state owes an attempt (`--once` waits for them). */
      const unsettledSlots = new Set<string>();
      const setPolicy = (slot: string, st: SlotPolicyState): void => {
        slotStates.set(slot, st);
        if (st.settled) unsettledSlots.delete(slot);
        else unsettledSlots.add(slot);
      };
      // Slot files re-read only where the watcher saw a change (full rescan at least every
      // maxSleepMs); the link's one cache, shared with presence (link.ts), when given.
      const slotCache = hooks.slotCache ?? new SlotCache(paths, config.maxSleepMs);
      /**
       * Every slot file as last read (valid or not): one gone since was retired (SPEC §8
       * reconcile). Fed by the cache's changes, so a wake costs what changed, not every slot.
       */
      const slots = new Map<string, SlotEntry>();
      /** When each renewable slot is next due; a slot popped from it is attempted, then rescheduled. */
      const queue = new DueQueue();
      /** Set when something every slot's due time depends on changed (the credential, its records forgotten). */
      let rescheduleAll = false;
      /**
       * Puts the slot at its due time, or out of the queue (invalid, revoked, gone). The
       * time depends on its slot file, its record and its policy state: each change of one
       * of them calls this (a change of the file through the cache, the others after its
       * attempt, or for all slots after a credential change).
       */
      const reschedule = (id: string): void => {
        const entry = slots.get(id);
        if (entry === undefined || 'error' in entry || entry.revoked === true) {
          queue.remove(id);
          return;
        }
        queue.schedule(id, dueAt(entry, state.readSync(id), slotStates.get(id) ?? freshSlot));
      };
      let unsettled = 0;
      let unusableLogged = false;

      // A record whose slot is gone (no file, not in the manifest) was retired while no link
      // ran (a host revocation, unenroll): kept, the slot created again would look already
      // delivered and wait out the old token's schedule. Pruned before the state poll starts
      // (`onPruned`), which is what can bring the slot back. A manifest that cannot be read
      // says nothing of its slots: nothing is pruned then (a forgotten record only costs a
      // renewal, but not 10 000 of them).
      const known = await slotIdsInHandoff(paths);
      if (known.manifest !== 'invalid') for (const slot of await state.recorded()) if (!known.ids.has(slot)) await state.forget(slot);
      hooks.onPruned?.();
      // A resume after a halt (of any part of the link): the failures' backoff was possibly
      // the refused credential's doing, so it is forgotten.
      const offResume = credential.onChange(() => {
        rescheduleAll = true;
        if (credential.halted) {
          // The refused credential's requestIds and deliveries mean nothing to the next one
          // (a new enrolment), and apply deletes every slot of a revoked host.
          slotStates.clear();
          unsettledSlots.clear();
          void state
            .recorded()
            .then((recorded) => Promise.all(recorded.map((s) => state.forget(s))))
            // Their due times were computed from the records just forgotten.
            .then(() => {
              rescheduleAll = true;
            });
          return;
        }
        log.info('host credential changed; resuming renewals');
        for (const [slot, st] of slotStates) setPolicy(slot, afterCredentialChange(st));
      });

      // sd_notify's STATUS= runs a process (systemd-notify): with a step per slot-file change,
      // 10 000 slots would spawn 10 000 of them. At most one a second, the latest text
      // last; a halt goes out at once.
      let statusText = '';
      let statusAt = 0;
      let statusTimer: NodeJS.Timeout | undefined;
      const status = (text: string, urgent = false): void => {
        if (!notifier.enabled || text === statusText) return;
        statusText = text;
        const wait = urgent ? 0 : statusAt + 1_000 - Date.now();
        if (wait > 0) {
          statusTimer ??= setTimeout(() => {
            statusTimer = undefined;
            statusAt = Date.now();
            void notifier.status(statusText);
          }, wait);
          return;
        }
        clearTimeout(statusTimer);
        statusTimer = undefined;
        statusAt = Date.now();
        void notifier.status(text);
      };

      const pool = new RenewPool({ max: config.concurrency });
      /** Renewals in flight, by slot: one whose slot is retired meanwhile is cut (renewSlot's signal). */
      const inFlight = new Map<string, AbortController>();

      /** Renews a due slot (its place in the pool taken); the time of its next attempt, or 'halt'. */
      const attempt = async (slot: SlotFile, token: string): Promise<number | 'halt'> => {
        const current = slotStates.get(slot.slot) ?? freshSlot;
        // One controller per renewal, aborted by whichever cuts it: its slot retired
        // (inFlight), the service's stop (a listener rather than AbortSignal.any, which cost
        // about 0.1 ms a renewal and keeps every combined signal tied to the service's until
        // it is collected) and a halt of the link (host-credential.ts, given the same one).
        const cut = new AbortController();
        inFlight.set(slot.slot, cut);
        const onStop = (): void => cut.abort();
        if (signal.aborted) cut.abort();
        signal.addEventListener('abort', onStop, { once: true });
        const started = performance.now();
        let outcome: RenewOutcome | undefined;
        try {
          // The pool's place is held until the answer is handed over and recorded, not only
          // until the Gateway answered: given back at the answer (session 13, measured) the
          // link renewed faster than apply applied, its inbox batches doubled (10 → 18
          // answers a file at 10 000 slots) and a disconnect during the burst waited for
          // apply's larger rounds (p50 0.83–0.90 → 1.18–1.29 s, p99 past 2 s), for no
          // measurable CPU gain on the link's side. docs/host-link.md, "Session 13".
          outcome = await renewSlot({ ...renewDeps, cut }, slot, token);
        } finally {
          signal.removeEventListener('abort', onStop);
          inFlight.delete(slot.slot);
          const latencyMs = performance.now() - started;
          const retry = outcome?.kind === 'retry' ? outcome : undefined;
          pool.release({
            // A network failure or a 429/5xx is the Gateway (or the path to it) struggling; an
            // invalid answer or a request cut (retired, stopped, halted) is not.
            overloaded: retry !== undefined && !cut.signal.aborted && (retry.status === undefined ? retry.reason.startsWith('network') : retry.status === 429 || retry.status >= 500),
            retryAfterMs: retry?.retryAfterMs,
            latencyMs,
          });
        }
        config.metrics?.iteration(outcome.kind, (performance.now() - started) / 1000);
        // From when the answer arrived (RFC 9110 Retry-After), not from the step's start.
        const decision = decide(current, outcome, Date.now(), { backoff: config.backoff });
        if (decision.kind === 'halt') return 'halt';
        setPolicy(slot.slot, decision.state);
        logDecision(log, slot.slot, outcome, decision);
        return decision.at;
      };

      const step = async (): Promise<number> => {
        const now = Date.now();
        const read = credential.read();
        if (read.kind === 'halted') {
          status('halted: host credential rejected (401)', true);
          return config.maxSleepMs;
        }
        if (read.kind === 'unusable') {
          if (!unusableLogged) log.error({ path: credential.path, problem: read.reason }, 'host credential unusable; renewals wait for it');
          unusableLogged = true;
          unsettled = 1;
          return config.maxSleepMs;
        }
        unusableLogged = false;
        const changes = await slotCache.changes(now);
        // A retired slot's memory must not outlive it: connected again, its new slot file
        // (generation 0) would look already delivered and wait out the old token's schedule.
        // Gone means no file at all (by name): a file unreadable for a moment is still there.
        for (const gone of changes.removed) {
          if (!slots.delete(gone)) continue;
          queue.remove(gone);
          slotStates.delete(gone);
          unsettledSlots.delete(gone);
          config.metrics?.forget(gone);
          await state.forget(gone);
        }
        for (const entry of changes.updated) {
          slots.set(entry.slot, entry);
          if ('error' in entry) log.warn({ file: entry.file, error: entry.error }, 'ignoring invalid slot file');
          // The token in force is the one apply wrote, so the slot file tells its expiry.
          else if (entry.revoked) config.metrics?.forget(entry.slot);
          else if (entry.expiresAt) config.metrics?.expiry(entry.slot, entry.expiresAt);
          if (!rescheduleAll) reschedule(entry.slot);
        }
        if (rescheduleAll) {
          rescheduleAll = false;
          for (const id of slots.keys()) reschedule(id);
        }
        // Bounded, adaptive concurrency across slots (renew-pool.ts); a slot popped from the
        // queue goes back only once the step has ended, so it is attempted at most once per
        // step and its requestId, backoff and order of attempts are exactly as when run one
        // by one. Slots not due are not looked at (a step over 10 000 settled slots is a peek).
        let halted: string | undefined; // the slot whose renewal met the 401
        let failure: { err: unknown } | undefined;
        const running = new Set<Promise<void>>();
        const taken: string[] = [];
        try {
          for (;;) {
            if (signal.aborted || halted !== undefined || failure) break;
            const id = queue.popDue(Date.now());
            if (id === undefined) break;
            taken.push(id);
            const slot = slots.get(id);
            // Only valid, unrevoked slots are queued (reschedule), and `slots` changes only above.
            if (slot === undefined || 'error' in slot) continue;
            if (!(await pool.acquire(signal))) break;
            if (halted !== undefined || failure || !(await slotCache.exists(id))) {
              // Halted, failed or retired while this slot waited for its place.
              pool.release({ overloaded: false, latencyMs: 0 });
              if (halted !== undefined || failure) break;
              continue;
            }
            const run = attempt(slot, read.credential)
              .then((at) => {
                if (at === 'halt') halted ??= id;
              })
              .catch((err: unknown) => {
                failure ??= { err };
              })
              .finally(() => running.delete(run));
            running.add(run);
          }
          await Promise.all(running);
        } finally {
          // Back in the queue at the time their new state says (attempted or not).
          for (const id of taken) reschedule(id);
        }
        if (config.once) {
          unsettled = 0;
          for (const id of unsettledSlots) {
            const entry = slots.get(id);
            if (entry !== undefined && !('error' in entry) && entry.revoked !== true) unsettled += 1;
          }
        }
        if (failure) throw failure.err;
        if (halted !== undefined) {
          // The credential logged the halt once for the whole link.
          unsettled += 1;
          log.warn({ slot: halted }, 'renewals halted with the link');
          status('halted: host credential rejected (401)', true);
          return config.maxSleepMs;
        }
        // The cache's next check bounds the sleep: after a burst of slot files it owes a
        // rescan within seconds (events the kernel dropped), not at maxSleepMs.
        const next = Math.min(now + config.maxSleepMs, queue.peekDue() ?? Infinity, now + slotCache.nextCheckIn(now));
        status(`${slots.size} slot(s); next renewal in ${Math.max(0, Math.round((next - Date.now()) / 1000))} s`);
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
            // Retired means no file and not in the manifest: a change of the manifest checks
            // every renewal in flight (at most the pool's size), a slot file's only its own.
            const slot = name === undefined ? undefined : slotOfFileName(name);
            const check = name === SLOT_MANIFEST_FILE ? [...inFlight.keys()] : slot !== undefined && inFlight.has(slot) ? [slot] : [];
            for (const id of check) {
              void slotCache.exists(id).then(
                (there) => {
                  if (!there) inFlight.get(id)?.abort();
                },
                () => undefined,
              );
            }
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
        clearTimeout(statusTimer);
        pool.close();
        offResume();
      }
    },
  };
}
