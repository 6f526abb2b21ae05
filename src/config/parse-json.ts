import { readFile } from 'node:fs/promises';
import type { z } from 'zod';
import { ConfigError } from '../errors.js';
import { describeIssues } from '../registry/schema.js';

export type ParseResult<T> = { ok: true; value: T } | { ok: false; error: string };

/**
 * JSON text → a zod-checked value, or an error that never quotes the text (V8's JSON
 * messages and zod's default messages can both echo what they read).
 */
export function parseJsonWith<T>(schema: z.ZodType<T>, text: string): ParseResult<T> {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return { ok: false, error: 'invalid JSON' };
  }
  const r = schema.safeParse(json);
  return r.success ? { ok: true, value: r.data } : { ok: false, error: `schema: ${describeIssues(r.error)}` };
}

/**
 * Reads a JSON config file for a command that edits or uses it once (bind, shims install):
 * missing → `empty`; invalid → a ConfigError naming the file (exit 2), never overwritten.
 */
export async function readConfigFile<T>(path: string, parse: (text: string) => ParseResult<T>, empty: T): Promise<T> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return empty;
    throw err;
  }
  const parsed = parse(text);
  if (!parsed.ok) throw new ConfigError(`${path} is invalid (${parsed.error}); fix or remove it first`);
  return parsed.value;
}
