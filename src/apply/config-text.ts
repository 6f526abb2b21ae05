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
const entryTexts = new WeakMap<object, string>();

function entryText(value: object): string {
  let text = entryTexts.get(value);
  if (text === undefined) {
    text = JSON.stringify(value, null, 2).replaceAll('\n', '\n  ');
    entryTexts.set(value, text);
  }
  return text;
}

const isPlainEntry = (v: unknown): v is object =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && !('toJSON' in v) && (Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null);

/** The file's text (with its final line break), as `${JSON.stringify(value, null, 2)}\n`. */
export function configText(value: unknown): string {
  if (typeof value !== 'object' || value === null || Array.isArray(value) || 'toJSON' in value) return `${JSON.stringify(value, null, 2)}\n`;
  const record = value as Record<string, unknown>;
  const keys = Object.keys(record);
  if (keys.length === 0) return '{}\n';
  const parts: string[] = [];
  for (const key of keys) {
    const entry = record[key];
    // Anything but a plain object (no entry of ours) is printed as JSON.stringify would, uncached.
    if (!isPlainEntry(entry)) return `${JSON.stringify(value, null, 2)}\n`;
    parts.push(`  ${JSON.stringify(key)}: ${entryText(entry)}`);
  }
  return `{\n${parts.join(',\n')}\n}\n`;
}
