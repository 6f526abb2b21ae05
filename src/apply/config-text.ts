/**
 * `JSON.stringify(value, null, 2)` of a registry or catalog, byte for byte, from a text
 * kept per entry object. apply wrote the 2 MB registry by pretty-printing all 10 000
 * entries for every new state (~5 % of its CPU in the renewal burst, one state per
 * disconnect); `toLocalConfig` reuses the entry object of every unchanged binding, so
 * only the changed entries are printed again. An entry is never mutated once made (the
 * plan, the RememberedFile and the token targets share it, and `toLocalConfig`'s own
 * memo relies on the same), so an entry's text stays its text.
 *
 * Why it is the same bytes: `JSON.stringify` with an indent of 2 prints a record's member
 * as `  "<key>": <value printed at depth 1>`, and a value printed at depth 1 is the value
 * printed alone with every line after the first indented by two more spaces (a JSON
 * string never holds a raw line break, so the only line breaks are the printer's). Keys
 * come in the same order (`Object.keys`, the order `JSON.stringify` uses); a record with
 * no key prints as `{}`. test/apply/config-text.test.ts compares with `JSON.stringify`.
 */
/** Per entry object: its key and its member's text (`  "<key>": <value>`). */
const memberTexts = new WeakMap<object, { key: string; text: string }>();

const isPlainEntry = (v: unknown): v is object =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && !('toJSON' in v) && (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null);

/** The file's text (with its final line break), as `${JSON.stringify(value, null, 2)}\n`. */
export function configText(value: unknown): string {
  if (typeof value !== 'object' || value === null || Array.isArray(value) || 'toJSON' in value) return `${JSON.stringify(value, null, 2)}\n`;
  const record = value as Record<string, unknown>;
  const keys = Object.keys(record);
  if (keys.length === 0) return '{}\n';
  const parts: string[] = new Array<string>(keys.length);
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i]!;
    const entry = record[key];
    const kept = typeof entry === 'object' && entry !== null ? memberTexts.get(entry) : undefined;
    if (kept?.key === key) {
      parts[i] = kept.text;
      continue;
    }
    // Anything but a plain object (no entry of ours) is printed as JSON.stringify would, uncached.
    if (!isPlainEntry(entry)) return `${JSON.stringify(value, null, 2)}\n`;
    const text = `  ${JSON.stringify(key)}: ${JSON.stringify(entry, null, 2).replaceAll('\n', '\n  ')}`;
    memberTexts.set(entry, { key, text });
    parts[i] = text;
  }
  return `{\n${parts.join(',\n')}\n}\n`;
}
