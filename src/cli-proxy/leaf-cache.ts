import { createSecureContext, type SecureContext } from 'node:tls';
import { issueLeaf, type LoadedCa } from './certificates.js';

export interface LeafCacheOptions {
  /** A leaf's lifetime (default 24 h): a stolen one is of little use for long. */
  validMs?: number;
  /** A cached leaf this close to its end is minted again (default 1 h). */
  renewBeforeMs?: number;
  /** Hosts kept; past it the least recently used goes (default 1 000). */
  maxEntries?: number;
  now?: () => number;
}

interface Entry {
  context: Promise<SecureContext>;
  notAfter: number;
}

export const DEFAULT_LEAF_VALID_MS = 24 * 3_600_000;
export const DEFAULT_LEAF_RENEW_BEFORE_MS = 3_600_000;

/**
 * Leaf certificates by host name, in memory only (mitmproxy's certificate store): minted
 * on first use, shared by concurrent handshakes for the same host, minted again before
 * they expire. The caller asks only for catalog hosts; this cache does not check.
 */
export class LeafCache {
  readonly #ca: LoadedCa;
  readonly #validMs: number;
  readonly #renewBeforeMs: number;
  readonly #max: number;
  readonly #now: () => number;
  /** Map order is use order: the first key is the least recently used. */
  readonly #entries = new Map<string, Entry>();
  /** How many leaves were minted (for tests and the log). */
  minted = 0;

  constructor(ca: LoadedCa, options: LeafCacheOptions = {}) {
    this.#ca = ca;
    this.#validMs = options.validMs ?? DEFAULT_LEAF_VALID_MS;
    this.#renewBeforeMs = options.renewBeforeMs ?? DEFAULT_LEAF_RENEW_BEFORE_MS;
    this.#max = options.maxEntries ?? 1_000;
    this.#now = options.now ?? Date.now;
  }

  /** The TLS server context for `host` (lower case), minting its leaf if needed. */
  context(host: string): Promise<SecureContext> {
    const now = this.#now();
    const cached = this.#entries.get(host);
    this.#entries.delete(host);
    if (cached && cached.notAfter - now > this.#renewBeforeMs) {
      this.#entries.set(host, cached);
      return cached.context;
    }
    const entry: Entry = { context: Promise.resolve(undefined as never), notAfter: now + this.#validMs };
    entry.context = issueLeaf(this.#ca, host, this.#validMs, new Date(now)).then((leaf) => {
      entry.notAfter = leaf.notAfter.getTime();
      return createSecureContext({ key: leaf.key, cert: leaf.cert, minVersion: 'TLSv1.2' });
    });
    this.minted += 1;
    // A failed mint is not kept: the next handshake tries again.
    entry.context.catch(() => {
      if (this.#entries.get(host) === entry) this.#entries.delete(host);
    });
    this.#entries.set(host, entry);
    while (this.#entries.size > this.#max) this.#entries.delete(this.#entries.keys().next().value as string);
    return entry.context;
  }

  get size(): number {
    return this.#entries.size;
  }
}
