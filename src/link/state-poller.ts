import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { desiredStateVersion, MAX_STATE_BYTES } from '../data/desired-state.js';
import { handoffPaths } from '../data/handoff.js';
import { hostRevokedPath } from '../data/host-revoked.js';
import { STATE_PATH, STATE_POLL_MAX_MS } from '../data/link-wire.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { readBoundedText } from '../fs/bounded-read.js';
import type { LinkMetrics } from '../metrics/link-metrics.js';
import { backoffDelay, type BackoffOptions } from '../net/backoff.js';
import { runLoop } from '../service/loop.js';
import type { Service } from '../service/service.js';
import type { LinkErrorCode } from '../data/link-status.js';
import { crashPoint } from '../service/test-hooks.js';
import type { GatewayOutcome } from './gateway-client.js';
import type { HostCredential } from './host-credential.js';
import type { PollEvent } from './link-status.js';

export interface StatePollerConfig {
  handoffDir: string;
  /** Client timeout of one long poll: a little above the Gateway's 60 s hold. */
  pollTimeoutMs: number;
  backoff: BackoffOptions;
  /** While the credential is unusable or refused, how often it is read again. */
  credentialRecheckMs: number;
  /** Called after a new desired state was handed over (presence reports soon after). */
  onHandedOver?: (version: number) => void;
  /** Told how each poll ended (link-status.json for doctor). */
  onPoll?: (event: PollEvent) => void;
  /** Not a poll before this settles: renewal forgets the slots retired while no link ran, before a state can bring them back. */
  startAfter?: Promise<void>;
  /** Link state and last sync (`--metrics-listen`). */
  metrics?: LinkMetrics | undefined;
}

export const defaultStatePollerConfig = {
  pollTimeoutMs: STATE_POLL_MAX_MS + 15_000,
  backoff: { baseMs: 1_000, capMs: 60_000 },
  credentialRecheckMs: 30_000,
};

type PollOutcome =
  | { kind: 'state'; version: number; text: string }
  | { kind: 'unchanged' }
  | { kind: 'halted' }
  | { kind: 'retry'; code: LinkErrorCode; reason: string; retryAfterMs?: number };

/** The version of the desired state already handed over, valid or not (0: none, or no usable version). */
export async function handedOverVersion(path: string): Promise<number> {
  const text = await readBoundedText(path, MAX_STATE_BYTES).catch(() => undefined);
  return text === undefined ? 0 : (desiredStateVersion(text) ?? 0);
}

/**
 * What one answer to the long poll means. Any JSON with a usable version is a state to hand
 * over, valid or not: apply validates it as a whole, and a state that fails is final for
 * its version (SPEC §8), so the poll moves past it instead of fetching it again.
 */
export function pollOutcome(answer: GatewayOutcome): PollOutcome {
  switch (answer.kind) {
    case 'halted':
      return { kind: 'halted' };
    case 'retry': {
      const code = answer.cause === 'network' ? 'network' : answer.cause === 'oversize' ? 'invalid_state' : answer.status === 429 ? 'rate_limited' : 'gateway_unavailable';
      return { kind: 'retry', code, reason: answer.reason, ...(answer.retryAfterMs !== undefined && { retryAfterMs: answer.retryAfterMs }) };
    }
    case 'status':
      return { kind: 'retry', code: 'unexpected_status', reason: `status ${answer.status}` };
    case 'ok': {
      if (answer.status === 204) return { kind: 'unchanged' };
      if (answer.status !== 200) return { kind: 'retry', code: 'unexpected_status', reason: `status ${answer.status}` };
      const version = desiredStateVersion(answer.body);
      // The body is never logged: it names upstreams.
      if (version === null) return { kind: 'retry', code: 'invalid_state', reason: 'answer is not JSON with a usable version' };
      return { kind: 'state', version, text: answer.body };
    }
  }
}

/**
 * The link's state poller (SPEC §8): long polls `GET /v1/host/state?after=<v>` and hands
 * each versioned desired state to apply as `<handoff>/desired-state.json` (atomic, 0640;
 * the setgid hand-off directory gives it apply's group); apply validates it. Anything else
 * (429, 5xx, network, a hang, a body that is not JSON or has no usable version) leaves the
 * last file untouched and backs off with full jitter, never sooner than Retry-After. A 401
 * halts the link until the credential changes. It writes nothing else.
 */
export function createStatePoller(config: StatePollerConfig, credential: HostCredential): Service {
  return {
    name: 'link-state',
    async run({ signal, log, onReload }) {
      const paths = handoffPaths(config.handoffDir);
      await mkdir(paths.root, { recursive: true });
      if (config.startAfter) await Promise.race([config.startAfter, new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }))]);
      // A revoked host's next enrolment starts from nothing (the state of the old one may be left by a race).
      let after = existsSync(hostRevokedPath(paths.root)) ? 0 : await handedOverVersion(paths.desiredState);
      log.info({ version: after }, 'state poller started from the handed-over version');
      let attempt = 0;
      let unusableLogged = false;

      const step = async (): Promise<number> => {
        const read = credential.read();
        // The next credential may be a new enrolment, whose first state must come at once
        // whatever its version (the Gateway holds a poll whose `after` is its current one).
        if (read.kind !== 'ok') after = 0;
        if (read.kind === 'halted') {
          config.metrics?.state('halted');
          return config.credentialRecheckMs;
        }
        if (read.kind === 'unusable') {
          config.metrics?.state('no_credential');
          if (!unusableLogged) {
            config.onPoll?.({ kind: 'unusable', detail: read.reason });
            log.error({ path: credential.path, problem: read.reason }, 'host credential unusable; the state poll waits for it');
          }
          unusableLogged = true;
          return config.credentialRecheckMs;
        }
        unusableLogged = false;
        // A 401 to any other part of the link halts it: the poll in flight is cut, not left to run out.
        const answer = await credential.request(read.credential, {
          method: 'GET',
          path: STATE_PATH,
          query: { after: String(after) },
          timeoutMs: config.pollTimeoutMs,
          maxBodyBytes: MAX_STATE_BYTES,
          signal,
        });
        if (signal.aborted) return 0;
        const outcome = pollOutcome(answer);
        config.metrics?.polled(outcome.kind === 'halted' ? 'credential_invalid' : outcome.kind);
        switch (outcome.kind) {
          case 'unchanged':
            attempt = 0;
            config.onPoll?.({ kind: 'answered' });
            return 0;
          case 'halted':
            after = 0;
            return config.credentialRecheckMs;
          case 'state':
            attempt = 0;
            // Halted while the answer was read: the revocation wins, nothing is handed over.
            if (credential.halted) {
              after = 0;
              return config.credentialRecheckMs;
            }
            await atomicWrite(paths.desiredState, outcome.text, { mode: 0o640 });
            crashPoint('link-after-desired-state-write');
            log.info({ version: outcome.version, previous: after }, 'desired state handed over to apply');
            after = outcome.version;
            config.onHandedOver?.(outcome.version);
            config.onPoll?.({ kind: 'answered', version: outcome.version });
            return 0;
          case 'retry': {
            attempt += 1;
            config.onPoll?.({ kind: 'failed', code: outcome.code, detail: outcome.reason });
            const delayMs = backoffDelay(attempt, outcome.retryAfterMs, config.backoff);
            log.warn({ reason: outcome.reason, attempt, retryInMs: delayMs, retryAfterMs: outcome.retryAfterMs }, 'state poll failed; the last good state stays; retrying');
            return delayMs;
          }
        }
      };

      await runLoop({
        name: 'link-state',
        log,
        signal,
        step,
        subscribeWake: (wake) => {
          const offCred = credential.onChange(wake);
          const offReload = onReload(wake);
          return () => {
            offCred();
            offReload();
          };
        },
      });
    },
  };
}
