import { resolve } from 'node:path';
import { Option, type Command } from 'commander';
import { z } from 'zod';
import { resolveStateDir, stateLayout, type StateLayout } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { isLoopbackHostname } from '../net/loopback-address.js';
import { defaultUpstreamOptions, type UpstreamOptions } from '../http/upstream-agent.js';
import { DEFAULT_TOKEN_WAIT_MS } from '../token/token-wait.js';
import { parseListen, type ListenAddress } from '../http/loopback.js';
import { createLogger, LOG_LEVELS, type Logger } from '../log/logger.js';
import { passwdUids } from '../http/peer-access.js';
import { DEFAULT_BURST_PER_UID, DEFAULT_RATE_PER_UID, type PeerLimitFlags } from '../http/peer-limits.js';

/** zod at the CLI boundary: every option value is validated and typed here. */
export const positiveInt = z.coerce.number().int().positive();
export const nonNegativeInt = z.coerce.number().int().min(0);
export const logLevel = z.enum(LOG_LEVELS);

/**
 * The state layout a command works on: `--state-dir`'s, with `--instances`, `--providers`
 * and `--handoff` overriding their one path each.
 */
export function layoutFrom(opts: { stateDir?: unknown; instances?: unknown; providers?: unknown; handoff?: unknown }): StateLayout {
  const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);
  const layout = stateLayout(resolveStateDir(str(opts.stateDir)));
  const instances = str(opts.instances);
  const providers = str(opts.providers);
  const handoff = str(opts.handoff);
  return {
    ...layout,
    ...(instances ? { instances: resolve(instances) } : {}),
    ...(providers ? { providers: resolve(providers) } : {}),
    ...(handoff ? { handoff: resolve(handoff) } : {}),
  };
}

/** An http:// URL on loopback (127.0.0.1, ::1, localhost): where the parts talk to each other. */
export const loopbackHttpUrl = z.url().refine((v) => {
  const u = new URL(v);
  return u.protocol === 'http:' && isLoopbackHostname(u.hostname);
}, 'must be an http:// URL on loopback (127.0.0.1, ::1, localhost)');

export function parseOption<T>(schema: z.ZodType<T>, value: unknown, flag: string): T {
  const r = schema.safeParse(value);
  if (!r.success) throw new ConfigError(`${flag}: ${r.error.issues[0]?.message ?? 'invalid value'}`);
  return r.data;
}

/**
 * Every problem with a command's options, reported together (headscale's LoadConfig): an
 * operator fixing a unit's ExecStart= sees all of them in one start, not one per restart.
 * A failed value is replaced by its fallback so parsing can go on; `done()` throws before
 * anything could use one.
 */
export class OptionErrors {
  readonly #problems: string[] = [];

  parse<T>(schema: z.ZodType<T>, value: unknown, flag: string, fallback: T): T {
    const r = schema.safeParse(value);
    if (r.success) return r.data;
    this.#problems.push(`${flag}: ${r.error.issues[0]?.message ?? 'invalid value'}`);
    return fallback;
  }

  /** A parser that throws ConfigError (listen addresses, user names): its message is kept. */
  attempt<T>(parse: () => T, fallback: T): T {
    try {
      return parse();
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      this.#problems.push(err.message);
      return fallback;
    }
  }

  add(problem: string): void {
    this.#problems.push(problem);
  }

  done(): void {
    const [first, ...rest] = this.#problems;
    if (first === undefined) return;
    throw new ConfigError(rest.length === 0 ? first : `${this.#problems.length} problems with the options:\n  ${this.#problems.join('\n  ')}`);
  }
}

/**
 * `--allowed-uids 1000,alice`: numeric UIDs or user names (looked up in /etc/passwd, so
 * a typo fails at start rather than locking everyone out silently).
 */
export function parseAllowedUids(value: string | undefined, passwd = '/etc/passwd', flag = '--allowed-uids'): Set<number> | undefined {
  if (value === undefined || value.trim() === '') return undefined;
  let users: Map<string, number> | undefined;
  const uids = new Set<number>();
  for (const item of value.split(',').map((s) => s.trim()).filter(Boolean)) {
    if (/^\d+$/.test(item)) {
      uids.add(Number(item));
      continue;
    }
    users ??= passwdUids(passwd);
    const uid = users.get(item);
    if (uid === undefined) throw new ConfigError(`${flag}: no such user "${item}"`);
    uids.add(uid);
  }
  return uids;
}

/** `--log-level`, the same for every command that runs a service. */
export function logLevelOption(): Option {
  return new Option('--log-level <level>', 'log level').choices(LOG_LEVELS).default('info');
}

export function loggerFrom(opts: { logLevel?: unknown }): Logger {
  return createLogger(parseOption(logLevel, opts.logLevel, '--log-level'));
}

export const LOOPBACK_OWNER_HELP =
  'besides root and this service\'s user, the users (UIDs or names, comma-separated) whose plain-http loopback listeners may receive a token or the host credential; never an agent user';

/** `--loopback-owner-uids`, parsed like `--allowed-uids`. */
export function loopbackOwnerUids(opts: Record<string, unknown>, errors: OptionErrors): Set<number> | undefined {
  const value = typeof opts.loopbackOwnerUids === 'string' ? opts.loopbackOwnerUids : undefined;
  return errors.attempt(() => parseAllowedUids(value, undefined, '--loopback-owner-uids'), undefined);
}

/** The options of a loopback server (forwarder and cli-proxy), with its defaults. */
export function addServerOptions(cmd: Command, defaults: { listen: string; bodyLimit: number }): Command {
  return cmd
    .option('--listen <host:port>', 'loopback address to listen on (port 0 picks one)', defaults.listen)
    .option('--headers-timeout-ms <n>', 'time allowed for upstream response headers', String(defaultUpstreamOptions.headersTimeoutMs))
    .option('--body-limit-bytes <n>', 'largest request body accepted', String(defaults.bodyLimit))
    .option('--shutdown-grace-ms <n>', 'on SIGTERM, time in-flight requests get to finish', '10000')
    .option('--allowed-uids <list>', 'only these local users (UIDs or names, comma-separated) may connect')
    .option('--agent-users-file <file>', 'only the users named in this file (one name or UID per line; watched), root and the service user may connect')
    .option('--loopback-owner-uids <list>', LOOPBACK_OWNER_HELP)
    .option('--token-wait-ms <n>', 'after an upstream 401, how long to wait for a renewed token before answering 503 token_rejected (0: do not wait)', String(DEFAULT_TOKEN_WAIT_MS))
    .option('--max-connections <n>', 'connections open at once, all users (default: (open-files limit − reserve) / 2)')
    .option('--max-connections-per-uid <n>', 'connections one local user may hold open (default: a quarter of --max-connections; 0: no limit)')
    .option('--max-streams-per-uid <n>', 'requests one local user may have in flight, event streams included (default: half its connections; 0: no limit)')
    .option('--rate-per-uid <n>', 'requests per second one local user may send, sustained (0: no limit)', String(DEFAULT_RATE_PER_UID))
    .option('--burst-per-uid <n>', 'requests one local user may send at once above that rate', String(DEFAULT_BURST_PER_UID))
    .addOption(logLevelOption());
}

export interface ServerOptions {
  listen: ListenAddress;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  allowedUids: Set<number> | undefined;
  agentUsersFile: string | undefined;
  tokenWaitMs: number;
  limits: PeerLimitFlags;
}

const NO_LISTEN: ListenAddress = { host: '127.0.0.1', port: 0 };

/** Validates what addServerOptions declared; problems go to `errors`. */
export function serverOptions(opts: Record<string, unknown>, errors: OptionErrors): ServerOptions {
  return {
    listen: errors.attempt(() => parseListen(String(opts.listen)), NO_LISTEN),
    bodyLimit: errors.parse(positiveInt, opts.bodyLimitBytes, '--body-limit-bytes', 1),
    upstream: {
      ...defaultUpstreamOptions,
      headersTimeoutMs: errors.parse(positiveInt, opts.headersTimeoutMs, '--headers-timeout-ms', 1),
      loopbackOwnerUids: loopbackOwnerUids(opts, errors),
    },
    shutdownGraceMs: errors.parse(positiveInt, opts.shutdownGraceMs, '--shutdown-grace-ms', 1),
    allowedUids: errors.attempt(() => parseAllowedUids(typeof opts.allowedUids === 'string' ? opts.allowedUids : undefined), undefined),
    agentUsersFile: typeof opts.agentUsersFile === 'string' ? resolve(opts.agentUsersFile) : undefined,
    tokenWaitMs: errors.parse(nonNegativeInt, opts.tokenWaitMs, '--token-wait-ms', 0),
    limits: peerLimitFlags(opts, errors),
  };
}

const nonNegative = z.coerce.number().min(0).max(1e9);

/** The per-UID and process limits given; what is left out is derived at start from the descriptor limit. */
function peerLimitFlags(opts: Record<string, unknown>, errors: OptionErrors): PeerLimitFlags {
  const flags: PeerLimitFlags = {
    ratePerUid: errors.parse(nonNegative, opts.ratePerUid, '--rate-per-uid', DEFAULT_RATE_PER_UID),
    burstPerUid: errors.parse(positiveInt, opts.burstPerUid, '--burst-per-uid', DEFAULT_BURST_PER_UID),
  };
  if (opts.maxConnections !== undefined) flags.maxConnections = errors.parse(positiveInt, opts.maxConnections, '--max-connections', 1);
  if (opts.maxConnectionsPerUid !== undefined) flags.connectionsPerUid = errors.parse(nonNegativeInt, opts.maxConnectionsPerUid, '--max-connections-per-uid', 0);
  if (opts.maxStreamsPerUid !== undefined) flags.streamsPerUid = errors.parse(nonNegativeInt, opts.maxStreamsPerUid, '--max-streams-per-uid', 0);
  return flags;
}
