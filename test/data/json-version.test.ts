import t from 'tap';
import type { TapTest } from '../support/tap.js';
import { jsonTopLevelVersion } from '../../src/data/json-version.js';
import { desiredStateVersion } from '../../src/data/desired-state.js';

/** What the scanner must answer: `JSON.parse`'s reading, as desiredStateVersion did it. */
function reference(text: string): number | null | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return undefined;
  }
  const v: unknown = (parsed as { version?: unknown } | null)?.version;
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : null;
}

function same(t: TapTest, text: string): void {
  const got = jsonTopLevelVersion(text);
  const want = reference(text);
  if (!Object.is(got, want)) t.fail(`${JSON.stringify(text).slice(0, 200)}: got ${String(got)}, JSON.parse says ${String(want)}`);
}

const CRAFTED = [
  '',
  ' ',
  '{}',
  '{"version":1}',
  '{"version":0}',
  '{"version":-0}',
  '{"version":-1}',
  '{"version":1.0}',
  '{"version":1.5}',
  '{"version":1e3}',
  '{"version":1E+3}',
  '{"version":12e-1}',
  '{"version":9007199254740991}',
  '{"version":9007199254740992}',
  '{"version":1e400}',
  '{"version":"1"}',
  '{"version":null}',
  '{"version":true}',
  '{"version":[1]}',
  '{"version":{"version":1}}',
  '{"a":{"version":1}}',
  '[{"version":1}]',
  '{"version":1,"version":2}',
  '{"version":2,"version":"x"}',
  '{"version":"x","version":3}',
  '{"vers\\u0069on":4}',
  '{"version\\u0000":4}',
  '{"\\u0076ersion":5,"x":[]}',
  '{"__proto__":{"version":6}}',
  '{"__proto__":7,"version":8}',
  ' \t\r\n{ "version" : 9 } \n',
  '\uFEFF{"version":1}',
  '{"version":1}\u00a0',
  '{"version":1} x',
  '{"version":1}{',
  '{"version":01}',
  '{"version":+1}',
  '{"version":.5}',
  '{"version":1.}',
  '{"version":1e}',
  '{"version":-}',
  '{"version":0x10}',
  '{"version":Infinity}',
  '{"version":NaN}',
  '{"version":1,}',
  '{,"version":1}',
  '{"version" 1}',
  "{'version':1}",
  '{version:1}',
  '{"version":1',
  '{"version":1]',
  '{"a":[1,2,],"version":1}',
  '{"a":[,1],"version":1}',
  '{"a":[1 2],"version":1}',
  '{"a":{"b":1,},"version":1}',
  '{"a":{"b" 1},"version":1}',
  '{"a":{1:2},"version":1}',
  '{"a":"\\x41","version":1}',
  '{"a":"\\u00e9\\ud800\\udc00\\ud800","version":1}',
  '{"a":"\\u12G4","version":1}',
  '{"a":"\\u123","version":1}',
  '{"a":"tab\there","version":1}',
  '{"a":"\\"\\\\\\/\\b\\f\\n\\r\\t","version":2}',
  '{"a":"\u2028\u2029\ud800","version":3}',
  '{"a":tru,"version":1}',
  '{"a":true,"b":false,"c":null,"version":4}',
  '{"a":nul}',
  '{"a":[[[[[]]]]],"version":5}',
  '{"a":[[[[[]]]],"version":5}',
  '{"a":[{}],"b":[{"c":[]}],"version":6}',
  '{"a":"unterminated',
  '"version"',
  '1',
  '-0',
  'null',
  'true',
  '[]',
  '{"version":1}\u0000',
];

t.test('crafted inputs: the same answer as JSON.parse', async (t) => {
  for (const text of CRAFTED) same(t, text);
  t.equal(jsonTopLevelVersion('{"version":42,"bindings":{}}'), 42);
  t.equal(jsonTopLevelVersion('{"vers\\u0069on":4}'), 4, 'a key spelled with an escape is still the key');
  t.equal(jsonTopLevelVersion('{"version":1,"version":"x"}'), null, 'the last member wins');
  t.equal(jsonTopLevelVersion('{"version":1} x'), undefined);
  t.equal(desiredStateVersion('{"version":1} x'), null, 'desiredStateVersion: not JSON is null');
  t.equal(desiredStateVersion('{"version":7,"bindings":{}}'), 7);
});

t.test('deep nesting: no stack overflow, same answer', async (t) => {
  const depth = 200_000;
  same(t, `{"a":${'['.repeat(depth)}${']'.repeat(depth)},"version":3}`);
  same(t, `{"a":${'{"b":'.repeat(depth)}1${'}'.repeat(depth)},"version":3}`);
  same(t, `{"a":${'['.repeat(depth)}${']'.repeat(depth - 1)},"version":3}`);
  t.equal(jsonTopLevelVersion(`{"a":${'['.repeat(depth)}${']'.repeat(depth)},"version":3}`), 3);
});

/** A small deterministic generator, so a failure is reproducible. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function randomValue(r: () => number, depth: number): unknown {
  const k = Math.floor(r() * (depth > 3 ? 5 : 8));
  switch (k) {
    case 0:
      return null;
    case 1:
      return r() < 0.5;
    case 2:
      return Math.floor(r() * 2e6) - 1e6 + (r() < 0.3 ? r() : 0);
    case 3:
    case 4:
      return String.fromCharCode(...Array.from({ length: Math.floor(r() * 8) }, () => Math.floor(r() * (r() < 0.8 ? 128 : 0xffff))));
    case 5:
      return Array.from({ length: Math.floor(r() * 4) }, () => randomValue(r, depth + 1));
    default: {
      const o: Record<string, unknown> = {};
      for (let i = Math.floor(r() * 4); i > 0; i--) o[r() < 0.2 ? 'version' : `k${Math.floor(r() * 10)}`] = randomValue(r, depth + 1);
      return o;
    }
  }
}

const ALPHABET = ['{', '}', '[', ']', '"', ':', ',', '\\', 'u', '0', '1', '9', '-', '+', '.', 'e', 'E', ' ', '\n', '\t', 'n', 't', 'f', 'version', '"version":', 'x', '\u0001', '\ud800'];

t.test('random documents and their mutations: the same answer as JSON.parse', async (t) => {
  const r = rng(23);
  let checked = 0;
  for (let round = 0; round < 3_000; round++) {
    const doc: Record<string, unknown> = {};
    for (let i = Math.floor(r() * 5); i > 0; i--) doc[r() < 0.3 ? 'version' : `k${i}`] = randomValue(r, 1);
    if (r() < 0.5) doc.version = Math.floor(r() * 1e9);
    const text = r() < 0.2 ? JSON.stringify(doc, null, 2) : JSON.stringify(doc);
    same(t, text);
    checked += 1;
    for (let m = 0; m < 8; m++) {
      const at = Math.floor(r() * (text.length + 1));
      const op = Math.floor(r() * 3);
      const piece = ALPHABET[Math.floor(r() * ALPHABET.length)] as string;
      const mutated = op === 0 ? text.slice(0, at) + piece + text.slice(at) : op === 1 ? text.slice(0, at) + text.slice(at + 1 + Math.floor(r() * 3)) : text.slice(0, at) + piece + text.slice(at + piece.length);
      same(t, mutated);
      checked += 1;
    }
  }
  t.ok(checked >= 27_000, `${checked} inputs compared`);
});
