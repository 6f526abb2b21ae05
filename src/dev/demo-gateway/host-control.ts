import { createHash, randomBytes } from 'node:crypto';
import {
  desiredStateSchema,
  type DesiredBinding,
  type DesiredProvider,
  type DesiredState,
} from '../../data/desired-state.js';
import { STATE_POLL_MAX_MS, type EnrollOk, type EnrollRequest, type LinkError, type Presence } from '../../data/link-wire.js';
import { cliSlot, instanceSlot } from '../../data/renew-wire.js';
import type { AuditEvent, AuditUpload } from '../../data/audit-event.js';
import type { CredentialValidator, RenewAuthority } from './authority.js';

/**
 * The Gateway's side of the host link (SPEC §8) as a small state machine, next to the
 * renewal authority it shares its credentials with. Used by the dev demo Gateway and
 * wrapped by the test mock (test/support/mock-host-gateway.ts).
 *
 * Enrolment, in this order:
 *   1. a requestId seen before → the same answer, byte for byte, if it comes with the same
 *      code (a retry after a lost answer); with another code → 401 code_invalid. A host
 *      revoked since → 401 code_invalid (its credential is gone for good).
 *   2. the code unknown, expired, or already used (by another requestId) → 401 code_invalid.
 *   3. mint a hostId and a credential; the code is spent, bound to this requestId.
 * Codes are one-time and issued by the stand-in (`issuePairingCode`), as the platform does.
 *
 * The credentials it mints are the ones the renewal authority accepts: the constructor
 * installs this object's validator in the authority, so there is one list of hosts.
 *
 * Desired state: one per Gateway (the stand-in serves a single user's hosts), versions from
 * 1, always served whole. Connect and disconnect operations bump the version, create or
 * revoke the renewal slot, and wake every long poll at once. A poll's `after` equal to the
 * version waits (≤ longPollMs) and then answers 204; any other `after` (older, or newer
 * than the Gateway has, as after a Gateway reset) answers the current state at once.
 *
 * Secrets (codes, credentials) are kept only as SHA-256 digests; nothing here is logged.
 */

export interface HostControlOptions {
  authority: RenewAuthority;
  /** How long the state long poll is held before a 204. Default 60 s (SPEC §8's maximum). */
  longPollMs?: number;
  /** Lifetime of an issued pairing code. Default 10 min. */
  pairingCodeTtlMs?: number;
  /** Credentials accepted without enrolment (dev's own, tests that skip enrol), by hostId. */
  staticHosts?: Readonly<Record<string, string>>;
  now?: () => number;
  /** Called with the events an audit upload stored for the first time (dev shows them). */
  onAudit?: (hostId: string, events: readonly AuditEvent[]) => void;
}

export interface LinkResult {
  status: number;
  body?: EnrollOk | LinkError | DesiredState | { accepted: number };
  headers?: Record<string, string>;
}

export interface HostRecord {
  hostId: string;
  hostname: string | null;
  version: string | null;
  enrolledAt: number;
  revoked: boolean;
}

export interface PresenceRecord {
  /** The host the credential belongs to (not the body's claim). */
  hostId: string;
  at: number;
  body: Presence;
}

export interface HostControlStats {
  enrollCalls: number;
  enrolled: number;
  enrollReplays: number;
  codeInvalid: number;
  statePolls: number;
  unauthorized: number;
  auditUploads: number;
  /** Events received again after they were stored (a lost answer, a killed link): not stored twice. */
  auditRepeats: number;
}

export interface AuditRecord {
  hostId: string;
  at: number;
  event: AuditEvent;
}

interface CodeRecord {
  expiresAtMs: number;
  usedBy: string | undefined;
}

interface EnrolmentRecord {
  codeDigest: string;
  hostId: string;
  answer: Readonly<EnrollOk>;
}

function digest(s: string): string {
  return createHash('sha256').update(s, 'utf8').digest('hex');
}

const NO_STORE = { 'cache-control': 'no-store' };

export class HostControl {
  readonly longPollMs: number;
  readonly #authority: RenewAuthority;
  readonly #codeTtlMs: number;
  readonly #now: () => number;
  /** code digest → record. */
  readonly #codes = new Map<string, CodeRecord>();
  /** requestId → the committed enrolment. */
  readonly #enrolments = new Map<string, EnrolmentRecord>();
  /** credential digest → hostId. */
  readonly #credentials = new Map<string, string>();
  readonly #hosts = new Map<string, HostRecord>();
  #state: DesiredState = { version: 1, bindings: {}, providers: {} };
  readonly #listeners = new Set<() => void>();
  readonly #stats: HostControlStats = { enrollCalls: 0, enrolled: 0, enrollReplays: 0, codeInvalid: 0, statePolls: 0, unauthorized: 0, auditUploads: 0, auditRepeats: 0 };
  /** Every presence report received, oldest first, for tests to read. */
  readonly presences: PresenceRecord[] = [];
  /** Every audit event stored, once each, in the order first received. */
  readonly auditEvents: AuditRecord[] = [];
  /** By host: the largest `dropped` count it reported (the host's counter only grows). */
  readonly auditDropped = new Map<string, number>();
  readonly #auditIds = new Set<string>();
  readonly #onAudit: HostControlOptions['onAudit'];

  constructor(options: HostControlOptions) {
    this.#authority = options.authority;
    this.longPollMs = options.longPollMs ?? STATE_POLL_MAX_MS;
    this.#codeTtlMs = options.pairingCodeTtlMs ?? 10 * 60_000;
    this.#now = options.now ?? Date.now;
    this.#onAudit = options.onAudit;
    if (!(this.longPollMs > 0 && this.longPollMs <= STATE_POLL_MAX_MS)) throw new RangeError(`longPollMs must be in (0, ${STATE_POLL_MAX_MS}]`);
    for (const [hostId, credential] of Object.entries(options.staticHosts ?? {})) this.#addHost(hostId, credential, null, null);
    this.#authority.setCredential(this.validator);
  }

  /** The validator the renewal authority uses: a credential of a live host. */
  readonly validator: CredentialValidator = (bearer) => this.hostOf(bearer) !== undefined;

  /** The live host a credential belongs to, if any. */
  hostOf(bearer: string | undefined): string | undefined {
    if (bearer === undefined) return undefined;
    const hostId = this.#credentials.get(digest(bearer));
    return hostId !== undefined && this.#hosts.get(hostId)?.revoked === false ? hostId : undefined;
  }

  /** A new one-time pairing code, as the platform shows a user who adds a host. */
  issuePairingCode(options: { ttlMs?: number } = {}): string {
    // Crockford-like alphabet in groups: easy to read aloud and type.
    const alphabet = 'ABCDEFGHJKMNPQRSTVWXYZ23456789';
    const bytes = randomBytes(12);
    const chars = [...bytes].map((b) => alphabet[b % alphabet.length]).join('');
    const code = `${chars.slice(0, 4)}-${chars.slice(4, 8)}-${chars.slice(8, 12)}`;
    this.#codes.set(digest(code), { expiresAtMs: this.#now() + (options.ttlMs ?? this.#codeTtlMs), usedBy: undefined });
    return code;
  }

  enroll(body: EnrollRequest): LinkResult {
    this.#stats.enrollCalls += 1;
    const codeDigest = digest(body.code);
    const previous = this.#enrolments.get(body.requestId);
    if (previous) {
      if (previous.codeDigest !== codeDigest || this.#hosts.get(previous.hostId)?.revoked !== false) return this.#codeInvalid();
      this.#stats.enrollReplays += 1;
      return { status: 200, body: { ...previous.answer }, headers: NO_STORE };
    }
    const code = this.#codes.get(codeDigest);
    if (!code || code.usedBy !== undefined || this.#now() >= code.expiresAtMs) return this.#codeInvalid();
    code.usedBy = body.requestId;
    const hostId = `host_${randomBytes(8).toString('hex')}`;
    const credential = `hc_${randomBytes(32).toString('base64url')}`;
    this.#addHost(hostId, credential, body.host.hostname, body.host.version);
    const answer = Object.freeze({ hostId, credential });
    this.#enrolments.set(body.requestId, { codeDigest, hostId, answer });
    this.#stats.enrolled += 1;
    return { status: 200, body: { ...answer }, headers: NO_STORE };
  }

  /** The platform removed the host: its credential stops working for every endpoint. */
  revokeHost(hostId: string): void {
    const host = this.#hosts.get(hostId);
    if (host) host.revoked = true;
    this.#wake();
  }

  hosts(): HostRecord[] {
    return [...this.#hosts.values()].map((h) => ({ ...h }));
  }

  // --- desired state -------------------------------------------------------------------

  get version(): number {
    return this.#state.version;
  }

  /** A copy of the current desired state. */
  state(): DesiredState {
    return structuredClone(this.#state);
  }

  /** The user connected a binding: it joins the state and its renewal slot is created. */
  connectBinding(bindingId: string, binding: DesiredBinding): void {
    this.#change((s) => ({ ...s, bindings: { ...s.bindings, [bindingId]: binding } }));
    this.#authority.createSlot(instanceSlot(binding.instanceId));
  }

  /** Many bindings in one version (a large account), for scale tests. */
  connectBindings(bindings: Readonly<Record<string, DesiredBinding>>): void {
    this.connectMany(bindings, {});
  }

  /** Many bindings and providers in one version (a large account), for scale benches. */
  connectMany(bindings: Readonly<Record<string, DesiredBinding>>, providers: Readonly<Record<string, DesiredProvider>>): void {
    // Slots first: a host that gets the state at once can renew every slot of it.
    for (const b of Object.values(bindings)) this.#authority.createSlot(instanceSlot(b.instanceId));
    for (const name of Object.keys(providers)) this.#authority.createSlot(cliSlot(name));
    this.#change((s) => ({ ...s, bindings: { ...s.bindings, ...bindings }, providers: { ...s.providers, ...providers } }));
  }

  /**
   * The user disconnected a binding: it leaves the state, and its instance's slot is
   * revoked (every token of it stops working) unless another binding still uses it.
   */
  disconnectBinding(bindingId: string): void {
    const gone = this.#state.bindings[bindingId];
    if (!gone) return;
    this.#change((s) => ({ ...s, bindings: Object.fromEntries(Object.entries(s.bindings).filter(([id]) => id !== bindingId)) }));
    if (!Object.values(this.#state.bindings).some((b) => b.instanceId === gone.instanceId)) {
      this.#authority.revokeSlot(instanceSlot(gone.instanceId));
    }
  }

  connectProvider(name: string, provider: DesiredProvider): void {
    this.#change((s) => ({ ...s, providers: { ...s.providers, [name]: provider } }));
    this.#authority.createSlot(cliSlot(name));
  }

  disconnectProvider(name: string): void {
    if (!Object.hasOwn(this.#state.providers, name)) return;
    this.#change((s) => ({ ...s, providers: Object.fromEntries(Object.entries(s.providers).filter(([n]) => n !== name)) }));
    this.#authority.revokeSlot(cliSlot(name));
  }

  /**
   * One state poll. Answers at once (401, or 200 when `after` differs from the version),
   * else waits for a change, `longPollMs`, or `signal` (the client left), whichever is
   * first. A host revoked while it waits gets its 401.
   */
  async pollState(bearer: string | undefined, after: number, signal?: AbortSignal): Promise<LinkResult> {
    this.#stats.statePolls += 1;
    const immediate = this.#stateAnswer(bearer, after);
    if (immediate) return immediate;
    await new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.#listeners.delete(done);
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, this.longPollMs);
      this.#listeners.add(done);
      signal?.addEventListener('abort', done, { once: true });
    });
    return this.#stateAnswer(bearer, after) ?? { status: 204, headers: NO_STORE };
  }

  /** Long polls waiting right now. */
  get waitingPolls(): number {
    return this.#listeners.size;
  }

  presence(bearer: string | undefined, body: Presence): LinkResult {
    const hostId = this.hostOf(bearer);
    if (hostId === undefined) return this.#unauthorized();
    this.presences.push({ hostId, at: this.#now(), body });
    return { status: 204 };
  }

  /**
   * SPEC §9: stores each event once, keyed by host and event id (a repeat is accepted and
   * counted, not stored again), so the host may resend whatever it is unsure of.
   */
  audit(bearer: string | undefined, body: AuditUpload): LinkResult {
    const hostId = this.hostOf(bearer);
    if (hostId === undefined) return this.#unauthorized();
    this.#stats.auditUploads += 1;
    const fresh: AuditEvent[] = [];
    for (const event of body.events) {
      const key = `${hostId}/${event.id}`;
      if (this.#auditIds.has(key)) {
        this.#stats.auditRepeats += 1;
        continue;
      }
      this.#auditIds.add(key);
      this.auditEvents.push({ hostId, at: this.#now(), event });
      fresh.push(event);
    }
    this.auditDropped.set(hostId, Math.max(this.auditDropped.get(hostId) ?? 0, body.dropped));
    if (fresh.length > 0) this.#onAudit?.(hostId, fresh);
    return { status: 200, body: { accepted: body.events.length }, headers: NO_STORE };
  }

  stats(): HostControlStats {
    return { ...this.#stats };
  }

  /** Serialising it (e.g. by a logger) shows counters, never a secret. */
  toJSON(): HostControlStats {
    return this.stats();
  }

  /** Releases every waiting poll (each answers 204 or 200): for shutdown. */
  close(): void {
    this.#wake();
  }

  #stateAnswer(bearer: string | undefined, after: number): LinkResult | undefined {
    if (this.hostOf(bearer) === undefined) return this.#unauthorized();
    if (after !== this.#state.version) return { status: 200, body: this.state(), headers: NO_STORE };
    return undefined;
  }

  /** Applies a change only if the whole new state is valid: the stand-in never serves a bad one. */
  #change(edit: (s: DesiredState) => Omit<DesiredState, 'version'>): void {
    const next = { ...edit(this.#state), version: this.#state.version + 1 };
    this.#state = desiredStateSchema.parse(next);
    this.#wake();
  }

  #wake(): void {
    for (const l of [...this.#listeners]) l();
  }

  #addHost(hostId: string, credential: string, hostname: string | null, version: string | null): void {
    if (credential.length === 0) throw new RangeError('credential must not be empty');
    this.#hosts.set(hostId, { hostId, hostname, version, enrolledAt: this.#now(), revoked: false });
    this.#credentials.set(digest(credential), hostId);
  }

  #codeInvalid(): LinkResult {
    this.#stats.codeInvalid += 1;
    return { status: 401, body: { error: 'code_invalid' }, headers: NO_STORE };
  }

  #unauthorized(): LinkResult {
    this.#stats.unauthorized += 1;
    return { status: 401, body: { error: 'host_credential_invalid' }, headers: NO_STORE };
  }
}
