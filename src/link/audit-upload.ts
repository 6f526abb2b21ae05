import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { atomicWrite } from '../fs/atomic-write.js';
import { watchDir } from '../fs/dir-watch.js';
import {
  AUDIT_BATCH_MAX,
  AUDIT_PATH,
  auditAnswerSchema,
  auditUploadSchema,
  listAuditSpool,
  readDroppedCount,
  readSpooledEvent,
  removeSpooledEvent,
  UPLOAD_STATUS_FILE,
  type UploadStatus,
  type AuditEvent,
  type SpooledEvent,
} from '../data/audit-event.js';
import { backoffDelay, type BackoffOptions } from '../net/backoff.js';
import { runLoop } from '../service/loop.js';
import type { Service } from '../service/service.js';
import { SMALL_ANSWER_BYTES } from './gateway-client.js';
import type { HostCredential } from './host-credential.js';
import { eachBounded } from './renewal/bounded-each.js';

/** Spool files read or deleted at once: enough to keep libuv's thread pool busy, few descriptors. */
const FILE_CONCURRENCY = 16;

export interface AuditUploadConfig {
  /** The spool the cli-proxy writes (group-readable and -writable for the link). */
  dir: string;
  backoff: BackoffOptions;
  /**
   * Least time between two uploads while less than a batch waits: a trickle of CLI calls
   * goes up as one batch. With a whole batch (or more) waiting, batches go back to back.
   */
  minGapMs: number;
  /** A look at the spool even without a file event (a missed inotify event, a dropped.json-only change). */
  rescanMs: number;
  credentialRecheckMs: number;
  requestTimeoutMs: number;
}

export const defaultAuditUploadConfig = {
  backoff: { baseMs: 1_000, capMs: 5 * 60_000 },
  minGapMs: 2_000,
  rescanMs: 60_000,
  credentialRecheckMs: 30_000,
  requestTimeoutMs: 30_000,
};

type UploadOutcome =
  | { kind: 'accepted'; accepted: number }
  | { kind: 'halted' }
  | { kind: 'retry'; reason: string; retryAfterMs?: number };

async function post(config: AuditUploadConfig, credential: HostCredential, token: string, body: string, signal: AbortSignal): Promise<UploadOutcome> {
  const answer = await credential.request(token, {
    method: 'POST',
    path: AUDIT_PATH,
    body,
    timeoutMs: config.requestTimeoutMs,
    maxBodyBytes: SMALL_ANSWER_BYTES,
    signal,
  });
  if (answer.kind === 'halted' || answer.kind === 'retry') return answer;
  if (answer.kind === 'status' || answer.status !== 200) return { kind: 'retry', reason: `status ${answer.status}` };
  let json: unknown;
  try {
    json = JSON.parse(answer.body);
  } catch {
    return { kind: 'retry', reason: 'answer is not JSON' };
  }
  const accepted = auditAnswerSchema.safeParse(json);
  return accepted.success ? { kind: 'accepted', accepted: accepted.data.accepted } : { kind: 'retry', reason: 'answer is not {"accepted": n}' };
}

/**
 * The link's audit upload (SPEC §9): oldest spooled events first, in batches, `POST
 * /v1/host/audit`; an event file is deleted only once the Gateway has accepted it, so a
 * crash, an outage or a lost answer means the same events (same ids) are sent again and
 * the Gateway, idempotent by id, stores each once. 429 / 5xx / network: backoff with
 * jitter, never sooner than Retry-After. 401 halts the link with the state poll and presence.
 */
export function createAuditUpload(config: AuditUploadConfig, credential: HostCredential): Service {
  return {
    name: 'link-audit',
    async run({ signal, log, onReload }) {
      // tmpfiles.d makes it under systemd (2770, shared with the cli-proxy); elsewhere the first of the two to start does.
      // No setgid bit in the mode: the units' RestrictSUIDSGID= answers any mkdir that asks
      // for one with EPERM, even for a directory that exists. tmpfiles.d creates it 2770.
      await mkdir(config.dir, { recursive: true, mode: 0o770 });
      let attempt = 0;
      let lastSent = 0;
      let sentDropped = -1;
      let unusableLogged = false;

      const step = async (): Promise<number> => {
        const read = credential.read();
        if (read.kind === 'halted') return config.credentialRecheckMs;
        if (read.kind === 'unusable') {
          if (!unusableLogged) log.error({ problem: read.reason }, 'host credential unusable; audit upload waits for it');
          unusableLogged = true;
          return config.credentialRecheckMs;
        }
        unusableLogged = false;
        const names = (await listAuditSpool(config.dir)).slice(0, AUDIT_BATCH_MAX);
        const dropped = await readDroppedCount(config.dir);
        if (names.length === 0 && dropped === sentDropped) return config.rescanMs;
        // The gap only gathers a trickle into one batch. A full batch waiting means calls
        // come faster than one batch per gap: waiting then would let the spool's bound drop
        // the oldest while the Gateway keeps up (issue 21: 500 per 2 s lost 53 000 of 90 000).
        const gap = names.length < AUDIT_BATCH_MAX ? lastSent + config.minGapMs - Date.now() : 0;
        if (gap > 0) return gap;

        // Several files at a time: one by one, the reads and deletes took most of a batch's
        // time (~1 ms each on a busy VM), which capped the drain below a flood's rate.
        const files: Array<SpooledEvent | undefined> = names.map(() => undefined);
        await eachBounded(names.keys(), FILE_CONCURRENCY, async (i) => {
          files[i] = await readSpooledEvent(config.dir, names[i] as string);
          return undefined;
        });
        const batch: Array<{ name: string; event: AuditEvent }> = [];
        for (const spooled of files) {
          if (!spooled) continue;
          if ('invalid' in spooled) {
            // Written atomically by the cli-proxy, so this is not a half write: never sendable, never retried.
            log.error({ file: spooled.name, problem: spooled.invalid }, 'audit spool file is not a valid event; removed');
            await removeSpooledEvent(config.dir, spooled.name);
            continue;
          }
          batch.push(spooled);
        }
        if (batch.length === 0) {
          // Only dropped.json changed: the count goes up on the next batch, nothing to send alone.
          sentDropped = dropped;
          return 0;
        }
        const body = JSON.stringify(auditUploadSchema.parse({ events: batch.map((b) => b.event), dropped }));
        lastSent = Date.now();
        const outcome = await post(config, credential, read.credential, body, signal);
        if (signal.aborted) return 0;
        switch (outcome.kind) {
          case 'halted':
            return config.credentialRecheckMs;
          case 'retry': {
            attempt += 1;
            const delayMs = backoffDelay(attempt, outcome.retryAfterMs, config.backoff);
            log.warn({ reason: outcome.reason, events: batch.length, attempt, retryInMs: delayMs }, 'audit upload failed; events stay spooled; retrying');
            return delayMs;
          }
          case 'accepted': {
            attempt = 0;
            const accepted = Math.min(outcome.accepted, batch.length);
            await eachBounded(batch.slice(0, accepted), FILE_CONCURRENCY, async (b) => {
              await removeSpooledEvent(config.dir, b.name);
              return undefined;
            });
            sentDropped = dropped;
            log.info({ events: batch.length, accepted, dropped }, 'audit events uploaded');
            const uploaded: UploadStatus = { lastUploadAt: new Date().toISOString(), lastAccepted: accepted };
            await atomicWrite(join(config.dir, UPLOAD_STATUS_FILE), `${JSON.stringify(uploaded)}\n`, { mode: 0o640 }).catch((err: unknown) =>
              log.warn({ err: { message: (err as Error).message } }, 'could not record the audit upload for status'),
            );
            // Part of the batch refused without an error: the Gateway is pacing us; go on after the gap.
            // A full batch sent: more may wait; the next step lists the spool and goes on at once if so.
            return accepted < batch.length ? config.minGapMs : 0;
          }
        }
      };

      // Each event is a file: with thousands spooled, a watcher that re-lists the directory
      // on every event would cost more than the upload. Writers' temps are dot files.
      let onAdd: (() => void) | undefined;
      const unwatch = watchDir(
        config.dir,
        () => onAdd?.(),
        (err) => log.warn({ err: { message: err.message } }, 'watching the audit spool failed; rescanning on a timer'),
      );
      try {
        await runLoop({
          name: 'link-audit',
          log,
          signal,
          step,
          subscribeWake: (wake) => {
            // In backoff the retry takes every spooled file anyway. Inside the gap after an
            // upload, one wake at its end (the loop may be resting for the whole rescan).
            let gapWake: NodeJS.Timeout | undefined;
            // Files added inside the gap (each event file makes an event or two): a batch's worth
            // ends the gap early, so a flood does not wait for it. An over-count costs one listing.
            let addedInGap = 0;
            onAdd = (): void => {
              if (attempt > 0) return;
              const wait = lastSent + config.minGapMs - Date.now();
              addedInGap = wait > 0 ? addedInGap + 1 : 0;
              if (wait <= 0 || addedInGap >= AUDIT_BATCH_MAX) {
                addedInGap = 0;
                wake();
              }
              else
                gapWake ??= setTimeout(() => {
                  gapWake = undefined;
                  wake();
                }, wait);
            };
            const offCred = credential.onChange(wake);
            const offReload = onReload(wake);
            return () => {
              clearTimeout(gapWake);
              onAdd = undefined;
              offCred();
              offReload();
            };
          },
        });
      } finally {
        unwatch();
      }
    },
  };
}
