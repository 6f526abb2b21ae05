import type { Logger } from '../log/logger.js';
import { credentialDigest, credentialGate } from '../net/credential-gate.js';
import { readTokenFile } from '../token/token-file.js';
import type { GatewayClient, GatewayOutcome, GatewayRequest } from './gateway-client.js';

export type CredentialRead =
  | { kind: 'ok'; credential: string }
  /** Missing, unreadable, empty or malformed: nothing to send. */
  | { kind: 'unusable'; reason: string }
  /** Still the credential the Gateway refused (401). */
  | { kind: 'halted' };

/**
 * The host credential with the link's one stop switch, shared by renewal, the state poll,
 * presence and the audit upload: a 401 to any of them halts all of them, requests in flight
 * included, until the credential file changes; then all resume. Holds only a digest of a
 * refused credential.
 */
export class HostCredential {
  #haltedOn: string | undefined;
  readonly #listeners = new Set<() => void>();

  constructor(
    readonly path: string,
    readonly client: GatewayClient,
    private readonly log: Logger,
  ) {}

  get halted(): boolean {
    return this.#haltedOn !== undefined;
  }

  /** Reads the file now; a changed credential after a halt resumes (and wakes every service). */
  read(): CredentialRead {
    const read = readTokenFile(this.path);
    if (!read.ok) return { kind: 'unusable', reason: read.reason };
    const gate = credentialGate(this.#haltedOn, credentialDigest(read.token));
    if (gate === 'halted') return { kind: 'halted' };
    if (gate === 'resume') {
      this.#haltedOn = undefined;
      this.log.info('host credential changed; the link resumes');
      for (const fn of [...this.#listeners]) fn();
    }
    return { kind: 'ok', credential: read.token };
  }

  /** The Gateway answered 401 to this credential: stop everything sent with it. */
  halt(credential: string): void {
    if (this.#haltedOn !== undefined) return;
    this.#haltedOn = credentialDigest(credential);
    this.log.error(
      'host credential rejected by the Gateway (401): the link stopped renewals, the state poll, presence and the audit upload; re-enrol this host (sudo agent-connectors enroll --gateway URL --force); it resumes when the credential changes',
    );
    for (const fn of [...this.#listeners]) fn();
  }

  /**
   * One Gateway request with `credential` (read just before): cut if the link halts
   * meanwhile (a 401 to another of its services), and a 401 to it halts the link. Either
   * way the answer is `halted`.
   */
  async request(credential: string, req: Omit<GatewayRequest, 'credential'>, options: { cut?: AbortController } = {}): Promise<GatewayOutcome> {
    // Read before a halt by another part: not sent at all.
    if (this.halted) return { kind: 'halted' };
    // `options.cut`: the caller's own controller for this one request (a renewal's, which
    // its stop and its slot's retirement abort too); the halt aborts it as well, and its
    // signal is the request's. Otherwise a controller of our own, joined to `req.signal`.
    // At hundreds of renewals a second a second controller and AbortSignal.any per request
    // were ~3 % of the link's CPU (profiled at 10 000 slots).
    const own = options.cut;
    const cut = own ?? new AbortController();
    let cutByHalt = false;
    const off = this.onChange(() => {
      if (!this.halted) return;
      cutByHalt = true;
      cut.abort();
    });
    try {
      const signal = own ? own.signal : req.signal ? AbortSignal.any([req.signal, cut.signal]) : cut.signal;
      const outcome = await this.client.request({ ...req, credential, signal });
      if (cutByHalt) return { kind: 'halted' };
      if (outcome.kind === 'halted') this.halt(credential);
      return outcome;
    } finally {
      off();
    }
  }

  /** Calls `fn` on a halt or a resume; returns the unsubscribe. */
  onChange(fn: () => void): () => void {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }
}
