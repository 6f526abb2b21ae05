import { readFileSync } from 'node:fs';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { AppError } from '../errors.js';

/**
 * What one local user may take of a loopback proxy, and what the process takes in all
 * (issue 21, item 6: 11 000 hanging streams from one agent exhausted the forwarder's
 * descriptors, and every other caller's token read failed with EMFILE).
 *
 * Every accepted connection costs a descriptor, and every request in flight one more for
 * its upstream socket (undici reuses idle ones before opening another, so the pool never
 * holds more than the peak of requests in flight). So the process admits at most
 * `maxConnections` = (limit − reserve) / 2 connections; the reserve is for what every
 * request opens besides (the token file), the config and audit files, the log, the peer
 * check's helper. Past `maxConnections` a connection is answered 503 `overloaded` and
 * closed; past `maxConnections` + reserve / 4 it is closed unanswered, so even a flood of
 * refusals leaves three quarters of the reserve free.
 */
export interface PeerLimitsConfig {
  maxConnections: number;
  /** Past this many open, a new connection is closed at once, unanswered. */
  hardConnections: number;
  /** Open connections of one UID (0: no limit). */
  connectionsPerUid: number;
  /** Requests of one UID in flight at once, event streams included (0: no limit). */
  streamsPerUid: number;
  /** Requests per second of one UID, sustained (a token bucket; 0: no limit). */
  ratePerUid: number;
  /** Requests one UID may send at once above the rate (the bucket's size). */
  burstPerUid: number;
}

/** The flags' values; what is not given comes from the descriptor limit (`resolvePeerLimits`). */
export type PeerLimitFlags = Partial<Omit<PeerLimitsConfig, 'hardConnections'>>;

export const DEFAULT_RATE_PER_UID = 100;
export const DEFAULT_BURST_PER_UID = 200;

/** Node's own soft limit when /proc cannot say (Node raises the soft limit to the hard one at start). */
const FALLBACK_NOFILE = 1024;

/** The soft `Max open files` of this process, from /proc/self/limits; undefined if it cannot be read or is unlimited. */
export function readNofileLimit(text?: string): number | undefined {
  let limits = text;
  if (limits === undefined) {
    try {
      limits = readFileSync('/proc/self/limits', 'utf8');
    } catch {
      return undefined;
    }
  }
  const m = /^Max open files\s+(\d+|unlimited)\s/m.exec(limits);
  return m?.[1] && m[1] !== 'unlimited' ? Number(m[1]) : undefined;
}

/** The limits in force: each flag given, else its share of the descriptor limit `nofile`. */
export function resolvePeerLimits(flags: PeerLimitFlags, nofile = readNofileLimit() ?? FALLBACK_NOFILE): PeerLimitsConfig & { nofile: number } {
  const reserve = Math.max(128, Math.floor(nofile / 8));
  const maxConnections = flags.maxConnections ?? Math.max(16, Math.floor((nofile - reserve) / 2));
  // A quarter of the process's: it takes four agents at their limit to fill it.
  const connectionsPerUid = flags.connectionsPerUid ?? Math.max(8, Math.floor(maxConnections / 4));
  return {
    nofile,
    maxConnections,
    hardConnections: maxConnections + Math.floor(reserve / 4),
    connectionsPerUid,
    // Half its connections: an agent at its stream limit still gets a 429 rather than a refused connection.
    streamsPerUid: flags.streamsPerUid ?? Math.max(4, Math.floor(connectionsPerUid / 2)),
    ratePerUid: flags.ratePerUid ?? DEFAULT_RATE_PER_UID,
    burstPerUid: flags.burstPerUid ?? DEFAULT_BURST_PER_UID,
  };
}

/** What a UID's connection or request meets: nothing (go on), or the refusal to answer. */
export type Gate = AppError | undefined;

/** A peer whose UID could not be read (its socket gone, the lookup overloaded): one shared budget. */
export const UNKNOWN_PEER = -1;

interface Bucket {
  tokens: number;
  at: number;
}

/**
 * The counters behind PeerLimitsConfig, for one listener. Root and the service's own
 * user (`exempt`) are not agents: no per-UID limit applies to them; the process's own
 * limit applies to every connection.
 */
export class PeerLimits {
  #open = 0;
  readonly #connections = new Map<number, number>();
  readonly #streams = new Map<number, number>();
  readonly #buckets = new Map<number, Bucket>();

  constructor(
    readonly config: PeerLimitsConfig,
    private readonly exempt: ReadonlySet<number>,
    private readonly now: () => number = () => performance.now(),
  ) {}

  get open(): number {
    return this.#open;
  }

  /** A connection accepted (its UID not known yet): counted until it closes. 'drop': close it unanswered. */
  accept(socket: Socket): Gate | 'drop' {
    this.#open += 1;
    socket.once('close', () => void (this.#open -= 1));
    if (this.#open > this.config.hardConnections) return 'drop';
    if (this.#open > this.config.maxConnections) return new AppError('overloaded', undefined, { 'retry-after': '1' });
    return undefined;
  }

  /** The connection's UID is known: counted against it until the connection closes. */
  connected(socket: Socket, uid: number): Gate {
    if (this.exempt.has(uid)) return undefined;
    const n = (this.#connections.get(uid) ?? 0) + 1;
    this.#connections.set(uid, n);
    socket.once('close', () => decrement(this.#connections, uid));
    const max = this.config.connectionsPerUid;
    return max > 0 && n > max ? new AppError('too_many_connections') : undefined;
  }

  /** A request of `uid`: refused past its rate or its streams; else counted until `res` closes. */
  request(uid: number, res: ServerResponse): Gate {
    if (this.exempt.has(uid)) return undefined;
    const rate = this.config.ratePerUid;
    if (rate > 0) {
      const now = this.now();
      const b = this.#buckets.get(uid) ?? { tokens: this.config.burstPerUid, at: now };
      b.tokens = Math.min(this.config.burstPerUid, b.tokens + ((now - b.at) / 1000) * rate);
      b.at = now;
      this.#buckets.set(uid, b);
      if (b.tokens < 1) return new AppError('rate_limited', undefined, { 'retry-after': String(Math.max(1, Math.ceil((1 - b.tokens) / rate))) });
      b.tokens -= 1;
    }
    const max = this.config.streamsPerUid;
    const n = this.#streams.get(uid) ?? 0;
    if (max > 0 && n >= max) return new AppError('too_many_streams');
    this.#streams.set(uid, n + 1);
    res.once('close', () => decrement(this.#streams, uid));
    return undefined;
  }
}

function decrement(counts: Map<number, number>, uid: number): void {
  const n = (counts.get(uid) ?? 1) - 1;
  if (n <= 0) counts.delete(uid);
  else counts.set(uid, n);
}
