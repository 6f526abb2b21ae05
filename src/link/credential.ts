import type { Agent, Dispatcher } from 'undici';
import type { Logger } from '../log/logger.js';
import { credentialDigest, credentialGate } from '../net/credential-gate.js';
import { readTokenFile } from '../token/token-file.js';

export type CredentialRead =
  | { kind: 'ok'; credential: string }
  /** Missing, unreadable, empty or malformed: nothing to send. */
  | { kind: 'unusable'; reason: string }
  /** Still the credential the Gateway refused (401). */
  | { kind: 'halted' };

/**
 * The host credential as the link's services see it, one instance shared by the state
 * poller and presence: a 401 on either halts both until the credential file changes
 * (the same gate as renewal fetch). Holds only a digest of a refused credential.
 */
export class LinkCredential {
  #haltedOn: string | undefined;
  readonly #listeners = new Set<() => void>();

  constructor(
    readonly path: string,
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
      this.log.info('host credential changed; the link resumes polling and presence');
      for (const fn of [...this.#listeners]) fn();
    }
    return { kind: 'ok', credential: read.token };
  }

  /** The Gateway answered 401 to this credential: stop everything sent with it. */
  halt(credential: string): void {
    if (this.#haltedOn !== undefined) return;
    this.#haltedOn = credentialDigest(credential);
    this.log.error(
      'host credential rejected by the Gateway (401): the link stopped polling the desired state and reporting presence; re-enrol this host (sudo agent-connectors enroll --gateway URL --force); it resumes when the credential changes',
    );
    for (const fn of [...this.#listeners]) fn();
  }

  /**
   * Runs one request with a signal that also aborts when the link halts (a 401 to another
   * of its services): a request in flight is cut, not left to run out. `cut` says it was.
   */
  async unlessHalted<T>(signal: AbortSignal, request: (signal: AbortSignal) => Promise<T>): Promise<{ cut: boolean; value: T }> {
    const cut = new AbortController();
    const off = this.onChange(() => {
      if (this.halted) cut.abort();
    });
    try {
      const value = await request(AbortSignal.any([signal, cut.signal]));
      return { cut: cut.signal.aborted, value };
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

/** A JSON POST to a link endpoint with the host credential (presence, audit). */
export function postJson(agent: Agent, url: URL, credential: string, body: string, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
  return agent.request({
    origin: url.origin,
    path: url.pathname,
    method: 'POST',
    headers: { authorization: `Bearer ${credential}`, 'content-type': 'application/json' },
    body,
    signal,
  });
}
