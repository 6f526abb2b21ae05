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
