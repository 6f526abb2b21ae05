import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { ConfigError } from '../errors.js';
import { LOG_LEVELS } from '../log/logger.js';

/** zod at the CLI boundary: every option value is validated and typed here. */
export const positiveInt = z.coerce.number().int().positive();
export const logLevel = z.enum(LOG_LEVELS);

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
  const users = new Map<string, number>();
  const uids = new Set<number>();
  for (const item of value.split(',').map((s) => s.trim()).filter(Boolean)) {
    if (/^\d+$/.test(item)) {
      uids.add(Number(item));
      continue;
    }
    if (users.size === 0) {
      for (const line of readFileSync(passwd, 'utf8').split('\n')) {
        const [name, , uid] = line.split(':');
        if (name && uid && /^\d+$/.test(uid)) users.set(name, Number(uid));
      }
    }
    const uid = users.get(item);
    if (uid === undefined) throw new ConfigError(`--allowed-uids: no such user "${item}"`);
    uids.add(uid);
  }
  return uids;
}
