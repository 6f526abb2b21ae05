import { createHash } from 'node:crypto';
import { readdir, unlink } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { watch } from 'chokidar';
import type { Logger } from '../log/logger.js';
import type { Notifier } from '../service/sd-notify.js';
import type { Service } from '../service/service.js';
import { runLoop } from '../service/loop.js';
import { readTokenFile } from '../token/token-file.js';
import { FetchState } from './fetch-state.js';
import { createFetchAgent, renewSlot, type FetchDeps } from './fetch.js';
import { handoffPaths, readSlots, type SlotFile } from './handoff.js';
import { backoffDelay, defaultBackoff, renewDueAt, type BackoffOptions } from './schedule.js';

export interface FetchConfig {
  gatewayUrl: string;
  credentialPath: string;
  handoffDir: string;
  privateDir: string;
  /** One pass for a timer: settle every due slot (retrying within the budget), then exit. */
  once: boolean;
  onceBudgetMs: number;
  backoff: BackoffOptions;
  /** Longest sleep between scans even when nothing is due (catches missed file events). */
  maxSleepMs: number;
}

export const defaultFetchConfig = { once: false, onceBudgetMs: 120_000, backoff: defaultBackoff, maxSleepMs: 60_000 };

const REVOKED_PAUSE_MS = 10 * 60_000;

interface SlotRetry {
  attempt: number;
  notBefore: number;
}

/**
 * A fetch killed mid-write leaves its temp file (part of an answer, maybe part of a
 * token) in inbox/; apply ignores dot files, so fetch, the only writer, sweeps its own.
 */
async function removeStaleTemps(inbox: string, log: Logger): Promise<void> {
  const names = await readdir(inbox).catch(() => [] as string[]);
  for (const name of names) {
    if (name.startsWith('.') && name.endsWith('.tmp')) {
      await unlink(join(inbox, name)).catch(() => undefined);
      log.info({ file: name }, 'removed a temp file left by an interrupted write');
    }
  }
}

/** Thrown by `--once` when something could not be settled; the CLI exits 1. */
export class FetchIncompleteError extends Error {}

/**
 * renew fetch: schedule → renew → hand-off. Holds the host credential and nothing else:
 * it never sees a token file, only the hand-off directory and its private state.
 */
export function createFetchService(deps: { config: FetchConfig; log: Logger; notifier: Notifier }): Service {
  const { config, log, notifier } = deps;
  return {
    name: 'renew-fetch',
    async run(signal) {
      const paths = handoffPaths(config.handoffDir);
      const state = new FetchState(join(config.privateDir, 'slots'));
      await state.init();
      await removeStaleTemps(paths.inbox, log);
      const agent = createFetchAgent();
      const fetchDeps: FetchDeps = { gatewayUrl: config.gatewayUrl, paths, state, agent, log };
      const retries = new Map<string, SlotRetry>();
      const revokedUntil = new Map<string, number>();
      let halted: string | undefined; // hash of the credential the Gateway refused
      let unsettled = 0;

      const readCredential = (): string | undefined => {
        const read = readTokenFile(config.credentialPath);
        if (read.ok) return read.token;
        log.error({ path: config.credentialPath, problem: read.reason }, 'host credential unusable; renewals wait for it');
        return undefined;
      };

      const renewDue = async (slot: SlotFile, credential: string, now: number): Promise<number | 'halt'> => {
        const retry = retries.get(slot.slot);
        const st = await state.read(slot.slot);
        const delivered = st.delivered && st.delivered.generation >= slot.generation ? st.delivered : undefined;
        const times = delivered
          ? { tokenId: delivered.tokenId, expiresAt: Date.parse(delivered.expiresAt), issuedAt: Date.parse(delivered.receivedAt) }
          : {
              tokenId: slot.tokenId,
              expiresAt: slot.expiresAt ? Date.parse(slot.expiresAt) : null,
              issuedAt: slot.appliedAt ? Date.parse(slot.appliedAt) : null,
            };
        const due = Math.max(
          st.pending || st.adopted !== undefined ? 0 : renewDueAt(times),
          retry?.notBefore ?? 0,
          revokedUntil.get(slot.slot) ?? 0,
        );
        if (due > now) return due;

        const outcome = await renewSlot(fetchDeps, slot, credential);
        switch (outcome.kind) {
          case 'renewed': {
            retries.delete(slot.slot);
            log.info({ slot: slot.slot, tokenId: outcome.tokenId, expiresAt: outcome.expiresAt }, 'renewed; handed to apply');
            return renewDueAt({ tokenId: outcome.tokenId, expiresAt: Date.parse(outcome.expiresAt), issuedAt: Date.now() });
          }
          case 'conflict': {
            // Another renewal won; renew again at once against what the Gateway holds, but
            // back off if conflicts repeat (two hosts fighting over one slot).
            const attempt = (retry?.attempt ?? 0) + 1;
            const delay = attempt > 2 ? backoffDelay(attempt - 2, undefined, config.backoff) : 0;
            const answeredAt = Date.now();
            retries.set(slot.slot, { attempt, notBefore: answeredAt + delay });
            log.warn({ slot: slot.slot, currentTokenId: outcome.currentTokenId, attempt }, 'token conflict (409): adopted the Gateway\'s token id; renewing again');
            return answeredAt + delay;
          }
          case 'credential_invalid':
            return 'halt';
          case 'revoked':
            // apply marks the slot file revoked; until it has, do not ask again.
            retries.delete(slot.slot);
            revokedUntil.set(slot.slot, now + REVOKED_PAUSE_MS);
            log.warn({ slot: slot.slot }, 'slot revoked by the Gateway (404); no more renewals for it');
            return now + REVOKED_PAUSE_MS;
          case 'retry': {
            const attempt = (retry?.attempt ?? 0) + 1;
            const delay = backoffDelay(attempt, outcome.retryAfterMs, config.backoff);
            // Counted from when the answer arrived (RFC 9110 Retry-After), not the step's start.
            const answeredAt = Date.now();
            retries.set(slot.slot, { attempt, notBefore: answeredAt + delay });
            log.warn({ slot: slot.slot, reason: outcome.reason, attempt, retryInMs: delay, retryAfterMs: outcome.retryAfterMs }, 'renewal failed; will retry with the same requestId');
            return answeredAt + delay;
          }
        }
      };

      const step = async (): Promise<number> => {
        const now = Date.now();
        const credential = readCredential();
        if (!credential) {
          unsettled = 1;
          return config.maxSleepMs;
        }
        const hash = createHash('sha256').update(credential).digest('hex');
        if (halted === hash) return config.maxSleepMs;
        if (halted) {
          log.info('host credential changed; resuming renewals');
          halted = undefined;
          retries.clear();
        }
        const { slots, errors } = await readSlots(paths);
        for (const e of errors) log.warn(e, 'ignoring invalid slot file');
        let next = now + config.maxSleepMs;
        unsettled = 0;
        for (const slot of slots) {
          if (signal.aborted) break;
          if (slot.revoked) continue;
          const at = await renewDue(slot, credential, now);
          if (at === 'halt') {
            halted = hash;
            unsettled += 1;
            log.error(
              { slot: slot.slot },
              'host credential rejected by the Gateway (401): renewals stopped until the credential changes; replace it and restart or wait',
            );
            void notifier.status('halted: host credential rejected (401)');
            return config.maxSleepMs;
          }
          if (retries.has(slot.slot)) unsettled += 1;
          next = Math.min(next, at);
        }
        void notifier.status(`${slots.length} slot(s); next renewal in ${Math.max(0, Math.round((next - Date.now()) / 1000))} s`);
        return Math.max(0, next - Date.now());
      };

      try {
        if (config.once) {
          const deadline = Date.now() + config.onceBudgetMs;
          for (;;) {
            const wait = await step();
            if (halted || signal.aborted) break;
            if (unsettled === 0 && wait > 0) break;
            if (Date.now() + wait > deadline) break;
            await new Promise((r) => setTimeout(r, wait));
          }
          if (halted || unsettled > 0) throw new FetchIncompleteError(halted ? 'host credential rejected (401)' : 'some renewals did not settle; see the log');
          return;
        }
        await notifier.ready('renewing');
        // Dot files are writers' temps (0600 until renamed: unreadable to us, and chokidar
        // would emit EACCES for them); an error on the watch must never kill the loop.
        const watcher = watch(paths.slots, { ignoreInitial: true, depth: 0, ignored: (p: string) => basename(p).startsWith('.') });
        watcher.on('error', (err) => log.warn({ err: { message: (err as Error).message } }, 'watching slots/ failed; falling back to periodic scans'));
        try {
          await runLoop({
            name: 'renew-fetch',
            log,
            signal,
            step,
            subscribeWake: (wake) => {
              watcher.on('all', wake);
              const onHup = (): void => wake();
              process.on('SIGHUP', onHup);
              return () => process.off('SIGHUP', onHup);
            },
          });
        } finally {
          await watcher.close();
        }
      } finally {
        await agent.close().catch(() => undefined);
      }
    },
  };
}
