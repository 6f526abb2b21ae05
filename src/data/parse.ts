import { readFile } from 'node:fs/promises';
import type { z } from 'zod';
import { ConfigError } from '../errors.js';

/**
 * The parse helpers every on-disk and wire format shares. This module sits at the bottom
 * of the data layer: it imports nothing of ours but the error file.
 */

export type ParseResult<T> = { ok: true; value: T } | { ok: false; error: string };

/**
 * A short, non-secret prefix of a record key, safe for logs. Registry keys are binding ids
 * (capabilities), so no format ever prints a whole key.
 */
export function keyPrefix(key: string): string {
  return `${key.slice(0, 4)}…`;
}

/**
 * zod's own messages may quote the offending text (an unknown key's name, say); ours are
 * built from the issue code or from the fixed messages our schemas declare, so no file
 * content reaches a log or /healthz.
 */
function issueMessage(issue: z.core.$ZodIssue): string {
  switch (issue.code) {
    case 'unrecognized_keys':
      return `${issue.keys.length} unknown propert${issue.keys.length === 1 ? 'y' : 'ies'}`;
    case 'invalid_key': {
      const nested = issue.issues[0];
      return nested && (nested.code === 'invalid_format' || nested.code === 'custom') ? `invalid key (${nested.message})` : 'invalid key';
    }
    case 'invalid_type':
      return `expected ${issue.expected}`;
    case 'custom':
    case 'invalid_format':
    case 'too_small':
    case 'too_big':
      return issue.message;
    default:
      return 'invalid value';
  }
}

/** The path positions that hold capability keys: a list, or a test of the issue's path (what the record is). */
export type KeyDepths = readonly number[] | ((path: readonly PropertyKey[], idx: number) => boolean);

/**
 * Formats zod issues without echoing values (a value could be a secret pasted by mistake).
 * `keyDepths`: the path positions that hold record keys (binding ids are capabilities), shown
 * only as a prefix; position 0 for the registry and catalog, 1 for the desired state.
 */
export function describeIssues(error: z.ZodError, keyDepths: KeyDepths = [0]): string {
  const hidden = typeof keyDepths === 'function' ? keyDepths : (path: readonly PropertyKey[], idx: number) => keyDepths.includes(idx);
  return error.issues
    .slice(0, 5)
    .map((i) => {
      // A key that failed its own rule is the file's text, whatever the record: a prefix only.
      const badKey = (idx: number): boolean => i.code === 'invalid_key' && idx === i.path.length - 1;
      const path = i.path.map((p, idx) => ((hidden(i.path, idx) || badKey(idx)) && typeof p === 'string' ? keyPrefix(p) : String(p))).join('.');
      return `${path || '(root)'}: ${issueMessage(i)}`;
    })
    .join('; ');
}

/**
 * JSON text → a zod-checked value, or an error that never quotes the text (V8's JSON
 * messages and zod's default messages can both echo what they read).
 */
export function parseJsonWith<T>(schema: z.ZodType<T>, text: string, keyDepths?: KeyDepths): ParseResult<T> {
  const json = parseJsonText(text);
  return json.ok ? checkWith(schema, json.value, keyDepths) : json;
}

/** JSON.parse without its message (V8's can quote the text). */
export function parseJsonText(text: string): ParseResult<unknown> {
  try {
    return { ok: true, value: JSON.parse(text) as unknown };
  } catch {
    return { ok: false, error: 'invalid JSON' };
  }
}

/** `parseJsonWith` for a value already parsed from JSON. */
export function checkWith<T>(schema: z.ZodType<T>, json: unknown, keyDepths?: KeyDepths): ParseResult<T> {
  const r = schema.safeParse(json);
  return r.success ? { ok: true, value: r.data } : { ok: false, error: `schema: ${describeIssues(r.error, keyDepths)}` };
}

/** Two JSON values equal (object keys in any order). */
export function sameJsonValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((v, i) => sameJsonValue(v, b[i]));
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.hasOwn(b, k) && sameJsonValue((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

/**
 * A record file (the registry, the catalog) read again after a change, given the value of
 * the last good read: an entry whose JSON equals its value then (a valid value: the
 * schemas here have defaults but no transforms, so a value parses to itself) is not
 * validated again; the others are, by the same schema, as a record of their own (same
 * keys, same error paths). Undefined when the file is not a record or any entry fails:
 * then the caller parses the whole, so what is accepted and every error are the full
 * parse's. 10 000 bindings took ~600 ms of the forwarder's CPU to validate whole, for a
 * change of one.
 */
export function recordReusing<V>(schema: z.ZodType<Record<string, V>>, json: unknown, previous: Readonly<Record<string, V>>): ParseResult<Record<string, V>> | undefined {
  if (typeof json !== 'object' || json === null || Array.isArray(json)) return undefined;
  // zod's record drops a `__proto__` key (JSON.parse makes it an own one): left to the full parse.
  if (Object.hasOwn(json, '__proto__')) return undefined;
  const entries = json as Record<string, unknown>;
  const keys = Object.keys(entries);
  const changedKeys = keys.filter((k) => !(Object.hasOwn(previous, k) && sameJsonValue(entries[k], previous[k])));
  // Nothing to reuse (a first load): the whole parse, without building a copy.
  if (changedKeys.length === keys.length) return undefined;
  const checked = schema.safeParse(Object.fromEntries(changedKeys.map((k) => [k, entries[k]])));
  if (!checked.success) return undefined;
  const fresh = checked.data;
  return { ok: true, value: Object.fromEntries(keys.map((k) => [k, (Object.hasOwn(fresh, k) ? fresh[k] : previous[k]) as V])) };
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
