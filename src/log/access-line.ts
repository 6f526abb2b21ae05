import { pino, type Logger } from 'pino';
import { LogSink } from './sink.js';

/** A request's access record: flat, primitives only, so it can be serialised without pino. */
export type AccessFields = Record<string, string | number | boolean | undefined>;

/** Keys the logger redacts (src/log/logger.ts); a flat record can only hold them at the top. */
const REDACTED: ReadonlySet<string> = new Set(['token', 'authorization', 'credential']);

export type AccessLog = (fields: AccessFields) => void;

/**
 * The access-line writer for one logger: the same JSON line pino would write for
 * `log.info(fields, 'access')` (level, time, pid, the logger's bindings, the fields, msg),
 * built directly. Through pino and its redaction this line cost ~18 µs per request — more
 * than the token read; here it is a couple of microseconds (docs/performance.md). The
 * record type admits no nested objects, so top-level redaction is the whole of it.
 * A logger that does not write to a LogSink (a test's) gets the plain pino call.
 */
export function accessLogFor(log: Logger): AccessLog {
  const sink: unknown = (log as unknown as Record<symbol, unknown>)[pino.symbols.streamSym];
  if (!(sink instanceof LogSink)) return (fields) => log.info(fields, 'access');
  const bindings = JSON.stringify(log.bindings());
  // The line's text after the time: its closing quote, the pid and the logger's bindings.
  const afterTime = `","pid":${process.pid}${bindings.length > 2 ? `,${bindings.slice(1, -1)}` : ''}`;
  // The line goes to the sink in pieces, joined once per window at its write: no string
  // per field, no concatenation chain per line (docs/performance.md, session 13).
  return (fields) => {
    if (!log.isLevelEnabled('info')) return;
    sink.part(LINE_START);
    sink.part(isoNow());
    sink.part(afterTime);
    for (const key in fields) {
      const value = fields[key];
      if (value === undefined) continue;
      const prefix = keyPrefix(key);
      if (prefix === REDACTED_KEY) {
        sink.part(`,${jsonString(key)}:"[redacted]"`);
        continue;
      }
      sink.part(prefix);
      if (typeof value !== 'string') sink.part(jsonScalar(value));
      else if (PLAIN.test(value)) {
        sink.part('"');
        sink.part(value);
        sink.part('"');
      } else sink.part(jsonString(value));
    }
    sink.part(LINE_END);
    sink.endLine();
  };
}

const LINE_START = '{"level":"info","time":"';
const LINE_END = ',"msg":"access"}\n';

/** Marks a key whose value is never written. */
const REDACTED_KEY = '';
/** `,"key":` per field name; the names are the record type's, a few dozen, so the cap is never the bound in practice. */
const prefixes = new Map<string, string>();
const MAX_PREFIXES = 256;

function keyPrefix(key: string): string {
  let prefix = prefixes.get(key);
  if (prefix === undefined) {
    prefix = REDACTED.has(key) ? REDACTED_KEY : `,${jsonString(key)}:`;
    if (prefixes.size < MAX_PREFIXES) prefixes.set(key, prefix);
  }
  return prefix;
}

/** Printable ASCII without a quote or a backslash: a string JSON would quote as it is. */
const PLAIN = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

/**
 * Strings JSON.stringify had to quote, by value: the binding prefix (`abcd…`) is one on
 * every forwarded request, and the same few recur. Bounded like the key prefixes; past
 * the bound a value is quoted each time.
 */
const quoted = new Map<string, string>();
const MAX_QUOTED = 256;
const MAX_QUOTED_LENGTH = 64;

function jsonString(value: string): string {
  if (PLAIN.test(value)) return `"${value}"`;
  let json = quoted.get(value);
  if (json === undefined) {
    json = JSON.stringify(value);
    if (quoted.size < MAX_QUOTED && value.length <= MAX_QUOTED_LENGTH) quoted.set(value, json);
  }
  return json;
}

function jsonScalar(value: number | boolean): string {
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (Number.isInteger(value)) return String(value);
  if (!Number.isFinite(value)) return 'null';
  return decimal(value);
}

/** `.1`, `.01`, `.001`, … `.999`, and '' for 0: thousandths as Number#toString ends them. */
const THOUSANDTHS = Array.from({ length: 1000 }, (_, i) => (i === 0 ? '' : `.${String(i).padStart(3, '0').replace(/0+$/, '')}`));

/**
 * Number#toString of a fraction, taken apart for the one every line has: the duration in
 * milliseconds rounded to the microsecond. The shortest-digits conversion of a double was
 * the line's largest cost (docs/performance.md, session 13); a value that is exactly the
 * double nearest to a number of thousandths, below 1e9, has that decimal as its shortest
 * spelling (doubles there lie far closer together than 0.001), so the integer part and
 * the thousandths' digits are the same text. Anything else is converted as before.
 */
function decimal(value: number): string {
  if (value > 0 && value < 1e9) {
    const thousandths = Math.round(value * 1000);
    if (thousandths / 1000 === value) {
      const whole = Math.floor(value);
      return `${whole}${THOUSANDTHS[thousandths - whole * 1000] as string}`;
    }
  }
  return String(value);
}

// The ISO time as Date#toISOString writes it, its `YYYY-MM-DDTHH:MM:SS.` built once per
// second and the milliseconds appended: at a request or more per millisecond, building it
// per millisecond (a Date and a C++ call) was a visible part of the line (docs/performance.md).
let lastMs = 0;
let lastIso = '';
let lastSecond = -1;
let secondPrefix = '';
const MS_DIGITS = Array.from({ length: 1000 }, (_, i) => `${String(i).padStart(3, '0')}Z`);

export function isoNow(now = Date.now()): string {
  if (now !== lastMs) {
    lastMs = now;
    const second = Math.floor(now / 1000);
    if (second !== lastSecond) {
      lastSecond = second;
      secondPrefix = new Date(second * 1000).toISOString().slice(0, -4);
    }
    lastIso = secondPrefix + (MS_DIGITS[now - second * 1000] as string);
  }
  return lastIso;
}
