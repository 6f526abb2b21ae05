import { mkdir, readFile } from 'node:fs/promises';
import { Agent } from 'undici';
import { parseDesiredState, MAX_STATE_BYTES } from '../data/desired-state.js';
import { handoffPaths } from '../data/handoff.js';
import { linkUrl, STATE_PATH, STATE_POLL_MAX_MS } from '../data/link-wire.js';
import { atomicWrite } from '../fs/atomic-write.js';
import type { LinkMetrics } from '../metrics/link-metrics.js';
import { backoffDelay, parseRetryAfter, type BackoffOptions } from '../net/backoff.js';
import { runLoop } from '../service/loop.js';
import type { Service } from '../service/service.js';
import type { LinkErrorCode } from '../data/link-status.js';
import { crashPoint } from '../service/test-hooks.js';
import type { LinkCredential } from './credential.js';
import type { PollEvent } from './link-status.js';

export interface StatePollerConfig {
  gatewayUrl: string;
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
  | { kind: 'credential_invalid' }
  | { kind: 'retry'; code: LinkErrorCode; reason: string; retryAfterMs?: number };

/** The version of the desired state already handed over (0: none, or an unusable file). */
export async function handedOverVersion(path: string): Promise<number> {
  const text = await readFile(path, 'utf8').catch(() => undefined);
  if (text === undefined) return 0;
  const parsed = parseDesiredState(text);
  return parsed.ok ? parsed.value.version : 0;
}

/** One long poll; never throws for anything the Gateway or the network does. */
async function pollOnce(agent: Agent, config: StatePollerConfig, credential: string, after: number, signal: AbortSignal): Promise<PollOutcome> {
  const url = linkUrl(config.gatewayUrl, STATE_PATH, { after: String(after) });
  let status: number;
  let retryAfter: string | string[] | undefined;
  let text = '';
  try {
    const res = await agent.request({
      origin: url.origin,
      path: url.pathname + url.search,
      method: 'GET',
      headers: { authorization: `Bearer ${credential}`, accept: 'application/json' },
      signal,
    });
    status = res.statusCode;
    retryAfter = res.headers['retry-after'];
    if (status !== 200) {
      await res.body.dump().catch(() => undefined);
    } else {
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of res.body) {
        const buf = chunk as Buffer;
        size += buf.length;
        if (size > MAX_STATE_BYTES) {
          res.body.destroy();
          return { kind: 'retry', code: 'invalid_state', reason: 'answer larger than the desired-state bound' };
        }
        chunks.push(buf);
      }
      text = Buffer.concat(chunks).toString('utf8');
    }
  } catch (err) {
    // The code only: an error's text can carry address details.
    const code = (err as { code?: string }).code ?? (signal.aborted ? 'aborted' : 'network_error');
    return { kind: 'retry', code: 'network', reason: `network: ${code}` };
  }
  if (status === 204) return { kind: 'unchanged' };
  if (status === 401) return { kind: 'credential_invalid' };
  if (status === 200) {
    const parsed = parseDesiredState(text);
    // The validator names the place and the rule, never a value; the body is never logged.
    if (!parsed.ok) return { kind: 'retry', code: 'invalid_state', reason: `invalid desired state: ${parsed.error}` };
    return { kind: 'state', version: parsed.value.version, text };
  }
  const code = status === 429 ? 'rate_limited' : status >= 500 ? 'gateway_unavailable' : 'unexpected_status';
  return { kind: 'retry', code, reason: `status ${status}`, retryAfterMs: parseRetryAfter(retryAfter, Date.now()) };
}

/**
 * The link's state poller (SPEC §8): long polls `GET /v1/host/state?after=<v>` and hands
 * each valid desired state to apply as `<handoff>/desired-state.json` (atomic, 0640; the
 * setgid hand-off directory gives it apply's group). Anything else (429, 5xx, network,
 * a hang, a body that is not JSON or fails validation) leaves the last good file untouched
 * and backs off with full jitter, never sooner than Retry-After. A 401 halts the link
 * until the credential changes. It writes nothing else.
 */
export function createStatePoller(config: StatePollerConfig, credential: LinkCredential): Service {
  return {
    name: 'link-state',
    async run({ signal, log, onReload }) {
      const paths = handoffPaths(config.handoffDir);
      await mkdir(paths.root, { recursive: true });
      let after = await handedOverVersion(paths.desiredState);
      log.info({ version: after }, 'state poller started from the handed-over version');
      const agent = new Agent({ headersTimeout: config.pollTimeoutMs, bodyTimeout: config.pollTimeoutMs, connect: { timeout: 10_000 } });
      let attempt = 0;
      let unusableLogged = false;

      const step = async (): Promise<number> => {
        const read = credential.read();
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
        // A 401 to presence halts the link: the poll in flight is cut, not left to run out.
        const { cut, value: outcome } = await credential.unlessHalted(signal, (s) => pollOnce(agent, config, read.credential, after, s));
        if (signal.aborted) return 0;
        if (cut) return config.credentialRecheckMs;
        config.metrics?.polled(outcome.kind);
        switch (outcome.kind) {
          case 'unchanged':
            attempt = 0;
            config.onPoll?.({ kind: 'answered' });
            return 0;
          case 'credential_invalid':
            credential.halt(read.credential);
            return config.credentialRecheckMs;
          case 'state':
            attempt = 0;
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

      try {
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
      } finally {
        await agent.destroy().catch(() => undefined);
      }
    },
  };
}
