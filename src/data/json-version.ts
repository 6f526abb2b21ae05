/**
 * `JSON.parse(text)?.version` as a safe non-negative integer, without building the value.
 *
 * The link reads the version of every desired state it is answered (`desiredStateVersion`,
 * SPEC §8: any JSON with a usable version is a state, anything else `invalid_state`). A
 * 10 000-binding state is 1.5 MB; `JSON.parse` built its ~100 000 objects and strings only
 * for one number, then the collector took them back: 5 % of the link's CPU during a
 * renewal burst with 25 disconnects, each a new state. This scanner checks the same grammar
 * (ECMA-404 as `JSON.parse` reads it: only space, tab, LF and CR as whitespace, no BOM; in a
 * string no unescaped `"`, `\` or control character below 0x20, lone surrogates allowed;
 * escapes `\" \\ \/ \b \f \n \r \t \uXXXX`; numbers `-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`;
 * any depth, with its own stack rather than the call stack) and allocates nothing but that
 * stack and a key that holds an escape. Its answer is `JSON.parse`'s: the text is JSON or
 * not by the same rules, the last top-level `version` wins as it does for `JSON.parse`, a
 * key spelled with escapes is decoded before it is compared, and the number is read by
 * `Number`, which rounds a JSON number literal exactly as `JSON.parse` does
 * (test/data/json-version.test.ts compares the two over crafted and mutated inputs).
 *
 * `undefined`: not JSON. `null`: JSON, but no usable version (not an object, no `version`,
 * or not a safe integer ≥ 0).
 */
const enum C {
  Tab = 9,
  Lf = 10,
  Cr = 13,
  Space = 32,
  Quote = 34,
  Plus = 43,
  Comma = 44,
  Minus = 45,
  Dot = 46,
  Slash = 47,
  Zero = 48,
  Nine = 57,
  Colon = 58,
  UpperA = 65,
  UpperE = 69,
  UpperF = 70,
  OpenBracket = 91,
  Backslash = 92,
  CloseBracket = 93,
  LowerA = 97,
  LowerB = 98,
  LowerE = 101,
  LowerF = 102,
  LowerN = 110,
  LowerR = 114,
  LowerT = 116,
  LowerU = 117,
  OpenBrace = 123,
  CloseBrace = 125,
}

/** From a member's key to the start of its value (past the key, `:` and whitespace); -1 if that is not there. */
function memberValue(text: string, i: number, n: number): number {
  const end = stringEnd(text, i, n);
  if (end < 0) return -1;
  const at = skipWs(text, end, n);
  return text.charCodeAt(at) === C.Colon ? skipWs(text, at + 1, n) : -1;
}

export function jsonTopLevelVersion(text: string): number | null | undefined {
  // One function with its state in locals: the hot loops over 1.5 MB stay in registers.
  const n = text.length;
  let i = 0;
  /** The open containers, innermost last: true for an object. Own stack, any depth. */
  const stack: boolean[] = [];
  let version: number | null = null;
  /** The value about to be read is the top-level object's `version` member. */
  let isVersion = false;
  i = skipWs(text, i, n);
  for (;;) {
    // A value starts at i (whitespace skipped).
    let c = text.charCodeAt(i);
    if (c === C.OpenBrace || c === C.OpenBracket) {
      if (isVersion) {
        version = null;
        isVersion = false;
      }
      i = skipWs(text, i + 1, n);
      const object = c === C.OpenBrace;
      if (text.charCodeAt(i) === (object ? C.CloseBrace : C.CloseBracket)) {
        i += 1;
      } else {
        stack.push(object);
        if (object) {
          // First member's key.
          const key = i;
          i = memberValue(text, i, n);
          if (i < 0) return undefined;
          // The key's end found again only at the top level: a state has a handful of those.
          if (stack.length === 1) isVersion = isVersionKey(text, key, stringEnd(text, key, n));
        }
        continue;
      }
    } else if (c === C.Quote) {
      const end = stringEnd(text, i, n);
      if (end < 0) return undefined;
      i = end;
      if (isVersion) {
        version = null;
        isVersion = false;
      }
    } else if (c === C.Minus || (c >= C.Zero && c <= C.Nine)) {
      const end = numberEnd(text, i);
      if (end < 0) return undefined;
      if (isVersion) {
        const v = Number(text.slice(i, end));
        version = Number.isSafeInteger(v) && v >= 0 ? v : null;
        isVersion = false;
      }
      i = end;
    } else {
      const word = c === C.LowerT ? 'true' : c === C.LowerF ? 'false' : c === C.LowerN ? 'null' : undefined;
      if (word === undefined || !text.startsWith(word, i)) return undefined;
      i += word.length;
      if (isVersion) {
        version = null;
        isVersion = false;
      }
    }
    // After a value: close containers, or go on to the next member or element.
    for (;;) {
      i = skipWs(text, i, n);
      if (stack.length === 0) return i === n ? version : undefined;
      c = text.charCodeAt(i);
      const object = stack[stack.length - 1] as boolean;
      if (c === C.Comma) {
        i = skipWs(text, i + 1, n);
        if (object) {
          const key = i;
          i = memberValue(text, i, n);
          if (i < 0) return undefined;
          // The key's end found again only at the top level: a state has a handful of those.
          if (stack.length === 1) isVersion = isVersionKey(text, key, stringEnd(text, key, n));
        }
        break;
      }
      if (c !== (object ? C.CloseBrace : C.CloseBracket)) return undefined;
      i += 1;
      stack.pop();
    }
    if (stack.length === 0) return version; // unreachable: a closed top level returned above
  }
}

/** Whether the key `text[start, end)` (quotes included) is `version`, escapes decoded. */
function isVersionKey(text: string, start: number, end: number): boolean {
  if (end - start === 9) return text.startsWith('"version"', start);
  // Only a key with an escape can be longer and still mean `version` (`"vers\\u0069on"`).
  return end - start > 9 && text.indexOf('\\', start) < end && JSON.parse(text.slice(start, end)) === 'version';
}

function skipWs(text: string, i: number, n: number): number {
  for (; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c !== C.Space && c !== C.Lf && c !== C.Cr && c !== C.Tab) break;
  }
  return i;
}

function isHex(c: number): boolean {
  return (c >= C.Zero && c <= C.Nine) || (c >= C.LowerA && c <= C.LowerF) || (c >= C.UpperA && c <= C.UpperF);
}

function isDigit(c: number): boolean {
  return c >= C.Zero && c <= C.Nine;
}

/** The index after the string starting at `i` (its opening quote), or -1 if none is there. */
function stringEnd(text: string, i: number, n: number): number {
  if (text.charCodeAt(i) !== C.Quote) return -1;
  for (i += 1; i < n; ) {
    const c = text.charCodeAt(i);
    if (c === C.Quote) return i + 1;
    if (c < C.Space) return -1;
    if (c !== C.Backslash) {
      i += 1;
      continue;
    }
    const e = text.charCodeAt(i + 1);
    if (e === C.LowerU) {
      if (!(isHex(text.charCodeAt(i + 2)) && isHex(text.charCodeAt(i + 3)) && isHex(text.charCodeAt(i + 4)) && isHex(text.charCodeAt(i + 5)))) return -1;
      i += 6;
    } else if (e === C.Quote || e === C.Backslash || e === C.Slash || e === C.LowerB || e === C.LowerF || e === C.LowerN || e === C.LowerR || e === C.LowerT) {
      i += 2;
    } else {
      return -1;
    }
  }
  return -1;
}

/** The index after the number starting at `i`, or -1 if it is not one. */
function numberEnd(text: string, i: number): number {
  if (text.charCodeAt(i) === C.Minus) i += 1;
  const first = text.charCodeAt(i);
  if (first === C.Zero) i += 1;
  else if (first > C.Zero && first <= C.Nine) while (isDigit(text.charCodeAt(++i)));
  else return -1;
  if (text.charCodeAt(i) === C.Dot) {
    if (!isDigit(text.charCodeAt(++i))) return -1;
    while (isDigit(text.charCodeAt(++i)));
  }
  const e = text.charCodeAt(i);
  if (e === C.LowerE || e === C.UpperE) {
    const sign = text.charCodeAt(++i);
    if (sign === C.Plus || sign === C.Minus) i += 1;
    if (!isDigit(text.charCodeAt(i))) return -1;
    while (isDigit(text.charCodeAt(++i)));
  }
  return i;
}
