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
  const head = `,"pid":${process.pid}${bindings.length > 2 ? `,${bindings.slice(1, -1)}` : ''}`;
  return (fields) => {
    if (!log.isLevelEnabled('info')) return;
    let line = `{"level":"info","time":"${new Date().toISOString()}"${head}`;
    for (const key in fields) {
      const value = fields[key];
      if (value === undefined) continue;
      line += `,${JSON.stringify(key)}:${REDACTED.has(key) ? '"[redacted]"' : JSON.stringify(value)}`;
    }
    sink.writeBatched(`${line},"msg":"access"}\n`);
  };
}
