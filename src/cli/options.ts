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
 * `--allowed-uids 1000,alice`: numeric UIDs or user names (looked up in /etc/passwd, so
 * a typo fails at start rather than locking everyone out silently).
 */
export function parseAllowedUids(value: string | undefined, passwd = '/etc/passwd'): Set<number> | undefined {
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
    if (uid === undefined) throw new ConfigError(`--allowed-uids: no such user "${item}"`);
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

/** The options of a loopback server (forwarder and cli-proxy), with its defaults. */
export function addServerOptions(cmd: Command, defaults: { listen: string; bodyLimit: number }): Command {
  return cmd
    .option('--listen <host:port>', 'loopback address to listen on (port 0 picks one)', defaults.listen)
    .option('--headers-timeout-ms <n>', 'time allowed for upstream response headers', String(defaultUpstreamOptions.headersTimeoutMs))
    .option('--body-limit-bytes <n>', 'largest request body accepted', String(defaults.bodyLimit))
    .option('--shutdown-grace-ms <n>', 'on SIGTERM, time in-flight requests get to finish', '10000')
    .option('--allowed-uids <list>', 'only these local users (UIDs or names, comma-separated) may connect')
    .option('--agent-users-file <file>', 'only the users named in this file (one name or UID per line; watched), root and the service user may connect')
    .option('--token-wait-ms <n>', 'after an upstream 401, how long to wait for a renewed token before answering 503 token_rejected (0: do not wait)', String(DEFAULT_TOKEN_WAIT_MS))
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
}

/** Validates what addServerOptions declared. */
export function serverOptions(opts: Record<string, unknown>): ServerOptions {
  return {
    listen: parseListen(String(opts.listen)),
    bodyLimit: parseOption(positiveInt, opts.bodyLimitBytes, '--body-limit-bytes'),
    upstream: { ...defaultUpstreamOptions, headersTimeoutMs: parseOption(positiveInt, opts.headersTimeoutMs, '--headers-timeout-ms') },
    shutdownGraceMs: parseOption(positiveInt, opts.shutdownGraceMs, '--shutdown-grace-ms'),
    allowedUids: parseAllowedUids(typeof opts.allowedUids === 'string' ? opts.allowedUids : undefined),
    agentUsersFile: typeof opts.agentUsersFile === 'string' ? resolve(opts.agentUsersFile) : undefined,
    tokenWaitMs: parseOption(nonNegativeInt, opts.tokenWaitMs, '--token-wait-ms'),
  };
}
