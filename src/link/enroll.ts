import { createHash, randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { z } from 'zod';
import { LINK_ENV_GATEWAY, LINK_ENV_HOST_ID, linkEnvPath } from '../data/link-env.js';
import { ENROLL_PATH, enrollOkSchema, linkErrorSchema, pairingCodeSchema, type EnrollOk } from '../data/link-wire.js';
import { parseJsonWith } from '../data/parse.js';
import { APPLY_UNIT, LINK_UNIT } from '../data/unit-names.js';
import { readAppliedState } from '../data/applied-state.js';
import { clearHostRevoked, hostRevokedPath, readHostRevoked, writeHostRevoked } from '../data/host-revoked.js';
import { watchDir } from '../fs/dir-watch.js';
import { ConfigError, EnrollError } from '../errors.js';
import { atomicWrite, checkWritableDir } from '../fs/atomic-write.js';
import { backoffDelay, type BackoffOptions } from '../net/backoff.js';
import { GatewayClient, SMALL_ANSWER_BYTES } from './gateway-client.js';
import { hookEnabled } from '../service/test-hooks.js';

/**
 * `agent-connectors enroll` and `unenroll` (SPEC §8): a one-time pairing code becomes the
 * host's long-term credential (GitHub runner's registration → credentials; Tailscale's auth
 * key → node key). The code is read from stdin or a terminal, never argv (argv is visible
 * to every local user). The credential goes 0600 where the link unit loads it
 * (`LoadCredential=host-credential:/etc/agent-connectors/host-credential`), the Gateway URL
 * beside it in `link.env` (the unit's `EnvironmentFile=`).
 *
 * The code is spent by the Gateway's first successful answer, so losing that answer must
 * not lose the host: one requestId is kept across every retry (a repeat answers the same
 * credential), and it is written to `<credential>.enroll-pending` (0600, with a digest of
 * the code, never the code) before anything is sent, so a second run with the same code,
 * after a crash or an outage, asks again with the same requestId. The credential's
 * directory is checked writable before the code is sent, for the same reason.
 */

export const DEFAULT_CREDENTIAL_PATH = '/etc/agent-connectors/host-credential';
export { LINK_ENV_GATEWAY as GATEWAY_URL_ENV, LINK_ENV_HOST_ID as HOST_ID_ENV };

export interface LinkFiles {
  credential: string;
  /** `AGENT_CONNECTORS_GATEWAY_URL=…` and `AGENT_CONNECTORS_HOST_ID=…`, 0644, beside the credential. */
  env: string;
  /** The requestId of an enrolment not yet stored. */
  pending: string;
}

export function linkFiles(credentialPath: string): LinkFiles {
  return { credential: credentialPath, env: linkEnvPath(credentialPath), pending: `${credentialPath}.enroll-pending` };
}

/** How enrol talks to systemd; replaced in unit tests. */
export interface Systemd {
  /** Whether systemd is the init system here (sd_booted: /run/systemd/system exists). */
  present(): boolean;
  systemctl(args: string[]): Promise<{ exitCode: number; stdout: string }>;
}

export const realSystemd: Systemd = {
  present: () => (hookEnabled('systemd:present') ? true : hookEnabled('systemd:absent') ? false : existsSync('/run/systemd/system')),
  async systemctl(args) {
    // Loaded when used: every command that imports this module for its paths (bind, list,
    // the link) would otherwise load execa's hundred modules at start (docs/performance.md).
    const { execa } = await import('execa');
    const r = await execa('systemctl', args, { reject: false, timeout: 60_000 });
    return { exitCode: r.exitCode ?? 1, stdout: String(r.stdout ?? '') };
  },
};

export interface EnrollOptions {
  gatewayUrl: string;
  credentialPath: string;
  force: boolean;
  /** Reads the pairing code; called only once the checks that need no code have passed. */
  readCode: () => Promise<string>;
  hostname: string;
  version: string;
  /** The hand-off directory: a host revocation there (data/host-revoked.ts) is lifted once the new credential is stored. */
  handoffDir?: string;
  /** Tries on 429, 5xx, network errors and invalid answers, all with one requestId. */
  attempts: number;
  backoff?: BackoffOptions;
  /** A Retry-After longer than this ends the run (the message says when to try again). */
  maxRetryAfterMs?: number;
  systemd?: Systemd;
  /** A line for the person running the command (progress, what to do next). */
  say: (line: string) => void;
  sleep?: (ms: number) => Promise<void>;
}

export interface EnrollResult {
  hostId: string;
  files: LinkFiles;
  /** What became of the link unit. */
  link: 'restarted' | 'not_running' | 'no_systemd';
}

const DEFAULT_BACKOFF: BackoffOptions = { baseMs: 500, capMs: 15_000 };

const pendingSchema = z.strictObject({ requestId: z.uuid(), codeDigest: z.string().regex(/^[0-9a-f]{64}$/) });

function isRoot(): boolean {
  return process.getuid?.() === 0;
}

function codeDigest(code: string): string {
  return createHash('sha256').update(`agent-connectors enroll\n${code}`, 'utf8').digest('hex');
}

/**
 * The Gateway URL as stored in link.env: https (http only to loopback, checked by the
 * caller), no query or fragment, no trailing slash; characters a systemd EnvironmentFile
 * would treat specially are refused rather than quoted.
 */
export function normaliseGatewayUrl(value: string): string {
  const url = new URL(value);
  if (url.search || url.hash) throw new ConfigError('--gateway: give the Gateway base URL without a query or fragment');
  const text = `${url.origin}${url.pathname.replace(/\/+$/, '')}`;
  if (!/^[\x21-\x7e]+$/.test(text) || /["'\\$`]/.test(text)) throw new ConfigError('--gateway: the URL contains characters that cannot be stored in link.env');
  return text;
}

function ownerRoot(): { uid: number; gid: number } | undefined {
  return isRoot() ? { uid: 0, gid: 0 } : undefined;
}

async function removeIfPresent(path: string): Promise<boolean> {
  try {
    await unlink(path);
    return true;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return false;
    if (code === 'EACCES' || code === 'EPERM') throw new ConfigError(`cannot remove ${path}: permission denied; run as root (sudo agent-connectors unenroll …)`);
    throw err;
  }
}

/** The requestId to use: the pending one if it was made for this same code, else a new one. */
async function requestIdFor(files: LinkFiles, digest: string): Promise<string> {
  const text = await readFile(files.pending, 'utf8').catch(() => undefined);
  if (text !== undefined) {
    const pending = parseJsonWith(pendingSchema, text);
    if (pending.ok && pending.value.codeDigest === digest) return pending.value.requestId;
  }
  const requestId = randomUUID();
  await atomicWrite(files.pending, `${JSON.stringify({ requestId, codeDigest: digest })}\n`, { mode: 0o600, owner: ownerRoot() });
  return requestId;
}

type Attempt = { kind: 'ok'; answer: EnrollOk } | { kind: 'retry'; reason: string; retryAfterMs?: number } | { kind: 'fail'; error: EnrollError };

/** A network error code as the person at the terminal reads it. */
function networkReason(code: string): string {
  const known: Record<string, string> = {
    ECONNREFUSED: 'connection refused',
    ENOTFOUND: 'host name not found',
    EAI_AGAIN: 'host name lookup failed',
    ECONNRESET: 'connection reset',
    ETIMEDOUT: 'connection timed out',
    UND_ERR_CONNECT_TIMEOUT: 'connection timed out',
    UND_ERR_HEADERS_TIMEOUT: 'no answer in time',
    UND_ERR_BODY_TIMEOUT: 'answer stalled',
    UND_ERR_SOCKET: 'connection closed before the answer',
  };
  return `${known[code] ?? 'network error'} (${code})`;
}

async function attempt(client: GatewayClient, body: string): Promise<Attempt> {
  const answer = await client.request({ method: 'POST', path: ENROLL_PATH, body, timeoutMs: 30_000, maxBodyBytes: SMALL_ANSWER_BYTES });
  if (answer.kind === 'retry') {
    const reason = answer.code !== undefined ? networkReason(answer.code) : answer.status !== undefined ? `HTTP ${answer.status}` : answer.reason;
    return { kind: 'retry', reason, ...(answer.retryAfterMs !== undefined && { retryAfterMs: answer.retryAfterMs }) };
  }
  // Enrol sends no credential, so no answer is `halted`: a 401 is the code's (below).
  if (answer.kind === 'halted') return { kind: 'fail', error: new EnrollError('the Gateway refused enrolment (HTTP 401): get a new pairing code from the platform and run enroll again') };
  const { status, body: text } = answer;
  const url = client.url(ENROLL_PATH);
  if (status === 200) {
    const ok = parseJsonWith(enrollOkSchema, text);
    // The Gateway committed; asking again with the same requestId answers the same body.
    return ok.ok ? { kind: 'ok', answer: ok.value } : { kind: 'retry', reason: 'the answer was not a valid enrolment' };
  }
  const code = parseJsonWith(linkErrorSchema, text);
  if (status === 401 && code.ok && code.value.error === 'code_invalid') {
    return {
      kind: 'fail',
      error: new EnrollError('the Gateway did not accept the pairing code (unknown, expired or already used): get a new code from the platform and run enroll again'),
    };
  }
  if (status === 401 || status === 403) {
    return { kind: 'fail', error: new EnrollError(`the Gateway refused enrolment (HTTP ${status}): get a new pairing code from the platform and run enroll again`) };
  }
  if (status === 404 || status === 405) {
    return { kind: 'fail', error: new EnrollError(`${url.origin} has no enrolment endpoint (HTTP ${status} on ${ENROLL_PATH}): check --gateway, it must be the Gateway's base URL`) };
  }
  return { kind: 'fail', error: new EnrollError(`the Gateway answered HTTP ${status} to the enrolment: check --gateway and that this agent-connectors version is supported`) };
}

/** Restarts the link where systemd runs it; elsewhere says how to start it. Never fails. */
async function restartLink(systemd: Systemd, say: (line: string) => void, startHint: string): Promise<EnrollResult['link']> {
  if (!systemd.present()) {
    say(`no systemd here: start the link yourself, e.g. ${startHint}`);
    return 'no_systemd';
  }
  const restarted = await systemd.systemctl(['try-restart', LINK_UNIT]).catch(() => ({ exitCode: 1, stdout: '' }));
  const active = await systemd.systemctl(['is-active', LINK_UNIT]).catch(() => ({ exitCode: 1, stdout: '' }));
  if (restarted.exitCode === 0 && active.exitCode === 0) {
    say(`restarted ${LINK_UNIT}: it now uses the new credential`);
    return 'restarted';
  }
  say(`${LINK_UNIT} is not running; start it: systemctl enable --now ${LINK_UNIT}`);
  return 'not_running';
}

export async function enroll(options: EnrollOptions): Promise<EnrollResult> {
  const { say } = options;
  const files = linkFiles(options.credentialPath);
  const systemd = options.systemd ?? realSystemd;
  const gatewayUrl = normaliseGatewayUrl(options.gatewayUrl);
  if (existsSync(files.credential) && !options.force) {
    throw new ConfigError(
      `this host is already enrolled (credential in ${files.credential}); to enrol it again with a new pairing code, add --force; to leave the Gateway, run agent-connectors unenroll`,
    );
  }
  const dir = dirname(files.credential);
  try {
    await checkWritableDir(dir, 'the host credential', { mode: 0o755 });
  } catch (err) {
    if (!isRoot()) throw new ConfigError(`enroll must run as root: it writes ${dir} (sudo agent-connectors enroll --gateway …)`);
    throw new EnrollError(`${(err as Error).message}; nothing was sent to the Gateway, the pairing code is still valid`);
  }

  const parsedCode = pairingCodeSchema.safeParse(await options.readCode());
  if (!parsedCode.success) throw new ConfigError(`${parsedCode.error.issues[0]?.message ?? 'invalid pairing code'}: copy the code from the platform again`);
  const code = parsedCode.data;
  const digest = codeDigest(code);
  const requestId = await requestIdFor(files, digest);

  const body = JSON.stringify({ requestId, code, host: { hostname: options.hostname.slice(0, 253) || 'unknown', version: options.version } });
  const client = new GatewayClient(gatewayUrl);
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const backoff = options.backoff ?? DEFAULT_BACKOFF;
  const maxRetryAfterMs = options.maxRetryAfterMs ?? 60_000;
  let answer: EnrollOk | undefined;
  try {
    for (let i = 1; ; i++) {
      const result = await attempt(client, body);
      if (result.kind === 'ok') {
        answer = result.answer;
        break;
      }
      if (result.kind === 'fail') {
        // A refused code is spent or unknown: the pending requestId is of no further use.
        await unlink(files.pending).catch(() => undefined);
        throw result.error;
      }
      if (i >= options.attempts) {
        throw new EnrollError(
          `could not enrol at ${gatewayUrl}: ${result.reason} after ${i} attempt${i === 1 ? '' : 's'}; check the URL and the network, then run enroll again with the same pairing code`,
        );
      }
      if (result.retryAfterMs !== undefined && result.retryAfterMs > maxRetryAfterMs) {
        throw new EnrollError(`the Gateway at ${gatewayUrl} asks to wait ${Math.ceil(result.retryAfterMs / 1000)} s: run enroll again then, with the same pairing code`);
      }
      const delay = backoffDelay(i - 1, result.retryAfterMs, backoff);
      say(`enroll: ${result.reason}; retrying in ${(delay / 1000).toFixed(1)} s (attempt ${i + 1} of ${options.attempts}, same request)`);
      await sleep(delay);
    }
  } finally {
    await client.close();
  }

  await atomicWrite(files.credential, `${answer.credential}\n`, { mode: 0o600, owner: ownerRoot() });
  await atomicWrite(
    files.env,
    `# Written by agent-connectors enroll; loaded by ${LINK_UNIT} (EnvironmentFile=).\n${LINK_ENV_GATEWAY}=${gatewayUrl}\n${LINK_ENV_HOST_ID}=${answer.hostId}\n`,
    { mode: 0o644, owner: ownerRoot() },
  );
  await unlink(files.pending).catch(() => undefined);
  // A new credential ends a revocation: the first desired state brings everything back.
  if (options.handoffDir !== undefined && (await clearHostRevoked(options.handoffDir))) say('the earlier revocation is lifted: the first desired state brings the bindings and providers back');
  say(`enrolled as host ${answer.hostId} at ${gatewayUrl}; credential in ${files.credential} (0600), Gateway URL in ${files.env}`);
  // link reads the Gateway URL and host id from link.env beside the credential.
  const link = await restartLink(systemd, say, `agent-connectors link --credential ${files.credential}`);
  return { hostId: answer.hostId, files, link };
}

export interface UnenrollOptions {
  credentialPath: string;
  /** The hand-off directory apply watches: the revocation goes there (skipped when it does not exist). */
  handoffDir?: string;
  /** How long to wait for apply to have deleted every token file and shim (0: do not wait). */
  waitMs?: number;
  systemd?: Systemd;
  say: (line: string) => void;
}

/**
 * Stops the link (where systemd runs it), hands apply the revocation (every token file and
 * shim deleted, registry and catalog emptied, every slot retired: the host serves nothing
 * until it is enrolled again; data/host-revoked.ts) and removes what enroll stored. The
 * Gateway still knows the host until it is removed in the platform, which is what revokes
 * the credential there.
 */
export async function unenroll(options: UnenrollOptions): Promise<{ removed: boolean }> {
  const { say } = options;
  const files = linkFiles(options.credentialPath);
  const systemd = options.systemd ?? realSystemd;
  if (!existsSync(files.credential) && !existsSync(files.env) && !existsSync(files.pending)) {
    say(`not enrolled (no ${files.credential}): nothing to do`);
    return { removed: false };
  }
  if (systemd.present()) {
    const stopped = await systemd.systemctl(['stop', LINK_UNIT]).catch(() => ({ exitCode: 1, stdout: '' }));
    say(stopped.exitCode === 0 ? `stopped ${LINK_UNIT}` : `could not stop ${LINK_UNIT} (systemctl exit ${stopped.exitCode}); stop it: systemctl stop ${LINK_UNIT}`);
  }
  const revoked = options.handoffDir !== undefined && existsSync(options.handoffDir) ? await revokeThroughApply(options.handoffDir, options.waitMs ?? 10_000, say) : false;
  const removed: string[] = [];
  for (const path of [files.credential, files.env, files.pending]) if (await removeIfPresent(path)) removed.push(path);
  say(
    `unenrolled: removed ${removed.join(', ')}; this host serves no binding or provider until it is enrolled again${revoked ? '' : ' (no hand-off directory: nothing for apply to remove)'}. Remove it in the platform too, so the Gateway forgets its credential.`,
  );
  return { removed: true };
}

/** Writes the revocation for apply and waits (bounded) until apply says it acted on it. */
async function revokeThroughApply(handoffDir: string, waitMs: number, say: (line: string) => void): Promise<boolean> {
  await writeHostRevoked(handoffDir, 'unenroll');
  const marker = await readHostRevoked(handoffDir);
  const done = async (): Promise<boolean> => {
    const applied = await readAppliedState(handoffDir);
    return applied?.hostRevoked !== undefined && applied.hostRevoked.at === marker?.at;
  };
  if (waitMs > 0 && !(await done())) {
    let wake: () => void = () => undefined;
    // A watch error leaves the bounded re-check below.
    const unwatch = watchDir(handoffDir, () => wake(), () => undefined);
    const deadline = Date.now() + waitMs;
    try {
      while (Date.now() < deadline && !(await done())) {
        await new Promise<void>((r) => {
          wake = r;
          setTimeout(r, Math.min(500, Math.max(0, deadline - Date.now())));
        });
      }
    } finally {
      unwatch();
    }
  }
  say(
    (await done())
      ? 'apply deleted every token file and shim, emptied the registry and the catalog and retired every slot'
      : `apply has not acted yet (is ${APPLY_UNIT} running?): it deletes every token file and shim as soon as it runs (${hostRevokedPath(handoffDir)})`,
  );
  return true;
}
