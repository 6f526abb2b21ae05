import { basename } from 'node:path';
import { Agent } from 'undici';
import { z } from 'zod';
import { agentUsersHealth } from '../data/agent-users.js';
import { appliedStatePath, readAppliedState } from '../data/applied-state.js';
import { handoffPaths, readSlots } from '../data/handoff.js';
import { SlotCache, type SlotListing } from '../data/slot-cache.js';
import { watchDir } from '../fs/dir-watch.js';
import { probePartHealth } from '../http/health-probe.js';
import { PRESENCE_PATH, presenceSchema, type Presence } from '../data/link-wire.js';
import { presenceProblems, type PartHealth } from '../data/problem-codes.js';
import type { Logger } from '../log/logger.js';
import { runLoop } from '../service/loop.js';
import type { Service } from '../service/service.js';
import { SMALL_ANSWER_BYTES } from './gateway-client.js';
import type { HostCredential } from './host-credential.js';

export type { PartHealth };

export interface PresenceConfig {
  handoffDir: string;
  hostId: string;
  version: string;
  /** Loopback /healthz URL of each part, by the part's presence name. */
  health: Record<string, string>;
  /** The regular report, jittered ±10 %. */
  intervalMs: number;
  /** Least time between two reports (a burst of changes makes one report). */
  minGapMs: number;
  healthTimeoutMs: number;
  /** For the report's answer from the Gateway. */
  requestTimeoutMs: number;
  /** The proxies' agent-users file: missing or empty is a problem (every agent gets 403). Undefined: not checked. */
  agentUsersFile?: string | undefined;
  /** Jitter source, [0, 1). */
  rand?: () => number;
}

export const defaultPresenceConfig = { intervalMs: 60_000, minGapMs: 1_000, healthTimeoutMs: 2_000, requestTimeoutMs: 15_000 };

/**
 * Least time between two reports that only a slot file's change asks for, per slot the
 * last report listed (never under `minGapMs`): with 11 000 slots a report costs ~20-30 ms
 * of CPU (its 1 MB body built, validated, serialised), and while renewals run a slot file
 * changes every few hundred ms (steady state at a 1 h token lifetime: ~4.6 a second), so at
 * `minGapMs` presence alone took ~3 % of a core. Scaled by the slot count, a slot change
 * costs about the same CPU a second at any size: reported within 1 s up to 1 000 slots,
 * 11 s at 11 000 (docs/scale.md, "Idle"). A state handed over, applied-state.json,
 * the credential and SIGHUP still report after `minGapMs`.
 */
export const SLOT_CHANGE_GAP_MS_PER_SLOT = 1;

/** The health of one part from its /healthz (http/health-probe.ts): bounded in size and time, anything else is `down`. */
export async function partHealth(agent: Agent, url: string, signal: AbortSignal, timeoutMs = defaultPresenceConfig.healthTimeoutMs): Promise<PartHealth> {
  return (await probePartHealth(url, { agent, signal, timeoutMs })).health;
}

/**
 * Builds one presence report from what is on disk and what the parts answer: the applied
 * version (apply's record), slots (slot, tokenId, expiresAt: never a token), parts' health
 * and stable problem codes. Validated against the wire schema before it is sent.
 */
export async function buildPresence(
  config: PresenceConfig,
  agent: Agent,
  credentialUsable: boolean,
  signal: AbortSignal,
  slotListing?: () => Promise<SlotListing>,
): Promise<Presence> {
  const paths = handoffPaths(config.handoffDir);
  const applied = await readAppliedState(config.handoffDir);
  const { slots, errors } = slotListing ? await slotListing() : await readSlots(paths);
  const parts: Record<string, PartHealth> = {};
  for (const [part, url] of Object.entries(config.health)) parts[part] = await partHealth(agent, url, signal, config.healthTimeoutMs);
  const agentUsers = config.agentUsersFile === undefined ? undefined : await agentUsersHealth(config.agentUsersFile);
  const problems = presenceProblems({ parts, applied, slotFileErrors: errors.length, credentialUsable, agentUsers });
  const body = {
    hostId: config.hostId,
    version: config.version,
    stateVersion: applied && applied.appliedAt !== null ? applied.version : null,
    parts,
    slots: slots.map((s) => ({ slot: s.slot, tokenId: s.tokenId, expiresAt: s.expiresAt })),
    problems,
  };
  if (!slotListing) return presenceSchema.parse(body);
  // The link's cache validated every slot when it read it (slotFileSchema: the same slot,
  // tokenId and expiresAt schemas as the wire's), so only the rest is checked here, and
  // the count: re-validating 11 000 entries per report cost ~45 ms a minute at rest.
  const checked = presenceWithValidatedSlots.parse({ ...body, slots: [] });
  if (body.slots.length > MAX_PRESENCE_SLOTS) throw new Error(`presence lists ${body.slots.length} slots, more than ${MAX_PRESENCE_SLOTS}`);
  return { ...checked, slots: body.slots };
}

/** The wire's bound on a report's slots (link-wire.ts). */
const MAX_PRESENCE_SLOTS = 20_000;
const presenceWithValidatedSlots = presenceSchema.extend({ slots: z.array(z.never()).max(0) });

/**
 * The link's presence (SPEC §8): `POST /v1/host/presence` every `intervalMs` (±10 %) and
 * soon after a change (a desired state handed over, applied-state.json or a slot file
 * changed; `changed()`). A failure is logged (status or error code, never a body) and
 * retried at the next tick; a 401 halts the link until the credential changes.
 */
export function createPresence(config: PresenceConfig, credential: HostCredential, shared?: { slotCache?: SlotCache }): { service: Service; changed: () => void } {
  let wakeLoop: (() => void) | undefined;
  /** A change that reports after `minGapMs` (the first report too). */
  let dirty = true;
  /** Only slot files changed since the last report (SLOT_CHANGE_GAP_MS_PER_SLOT). */
  let slotsDirty = false;
  const changed = (): void => {
    dirty = true;
    wakeLoop?.();
  };
  const slotChanged = (): void => {
    slotsDirty = true;
    wakeLoop?.();
  };
  const service: Service = {
    name: 'link-presence',
    async run({ signal, log, onReload }) {
      const rand = config.rand ?? Math.random;
      const paths = handoffPaths(config.handoffDir);
      const healthAgent = new Agent({ headersTimeout: config.healthTimeoutMs, bodyTimeout: config.healthTimeoutMs, connect: { timeout: config.healthTimeoutMs } });
      let lastSent = 0;
      let nextRegular = 0;
      let lastSlotCount = 0;
      /** The least gap before the next report: what is owed decides it (a regular tick is owed at nextRegular). */
      const gapNow = (now: number): number =>
        dirty || now >= nextRegular ? config.minGapMs : Math.max(config.minGapMs, lastSlotCount * SLOT_CHANGE_GAP_MS_PER_SLOT);
      // A report lists every slot; with 10 000 of them only the changed files are re-read.
      // The link's one cache, shared with renewal (link.ts), when given: one read per change.
      const slotCache = shared?.slotCache ?? new SlotCache(paths, config.intervalMs);

      const send = async (log: Logger): Promise<void> => {
        const read = credential.read();
        if (read.kind !== 'ok') {
          if (read.kind === 'unusable') log.warn({ problem: read.reason }, 'host credential unusable; presence not sent');
          return;
        }
        const body = await buildPresence(config, healthAgent, true, signal, () => slotCache.current());
        const answer = await credential.request(read.credential, {
          method: 'POST',
          path: PRESENCE_PATH,
          body: JSON.stringify(body),
          timeoutMs: config.requestTimeoutMs,
          maxBodyBytes: SMALL_ANSWER_BYTES,
          signal,
        });
        if (signal.aborted || answer.kind === 'halted') return;
        lastSlotCount = body.slots.length;
        if (answer.kind === 'ok') log.debug({ stateVersion: body.stateVersion, slots: body.slots.length, problems: body.problems }, 'presence reported');
        else if (answer.kind === 'status') log.warn({ status: answer.status }, 'presence refused; retrying at the next tick');
        else log.warn({ reason: answer.reason }, 'presence failed; retrying at the next tick');
      };

      const step = async (): Promise<number> => {
        const now = Date.now();
        if (credential.halted && credential.read().kind === 'halted') return config.intervalMs;
        if (!dirty && !slotsDirty && now < nextRegular) return nextRegular - now;
        const gap = gapNow(now);
        if (now - lastSent < gap) {
          const wait = gap - (now - lastSent);
          // The regular tick may come first, and owes only minGapMs.
          return now < nextRegular ? Math.min(wait, nextRegular - now) : wait;
        }
        dirty = false;
        slotsDirty = false;
        lastSent = now;
        await send(log);
        const interval = Math.round(config.intervalMs * (0.9 + 0.2 * rand()));
        nextRegular = Date.now() + interval;
        if (!dirty && !slotsDirty) return interval;
        return Math.max(0, gapNow(Date.now()) - (Date.now() - lastSent));
      };

      const appliedName = basename(appliedStatePath(config.handoffDir));
      const onWatchError = (err: Error): void => log.warn({ err: { message: err.message } }, 'watching the hand-off failed; presence keeps its regular ticks');
      const unwatchSlots = watchDir(
        paths.slots,
        (name) => {
          slotCache.changed(name);
          // Unnamed (a watcher's error, the directory replaced): anything may have changed.
          if (name === undefined) changed();
          else slotChanged();
        },
        onWatchError,
      );
      const unwatchRoot = watchDir(
        config.handoffDir,
        (name) => {
          if (name === undefined || name === appliedName) changed();
        },
        onWatchError,
      );
      try {
        await runLoop({
          name: 'link-presence',
          log,
          signal,
          step,
          subscribeWake: (wake) => {
            wakeLoop = wake;
            const offCred = credential.onChange(changed);
            const offReload = onReload(() => {
              slotCache.changed();
              changed();
            });
            return () => {
              wakeLoop = undefined;
              offCred();
              offReload();
            };
          },
        });
      } finally {
        unwatchSlots();
        unwatchRoot();
        await healthAgent.destroy().catch(() => undefined);
      }
    },
  };
  return { service, changed };
}
