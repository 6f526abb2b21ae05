import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';

export interface LogRecord {
  level: number;
  msg: string;
  [k: string]: unknown;
}

/** A real pino logger (level trace) whose JSON lines are collected in memory, raw and parsed. */
export function memoryLogger(): { log: Logger; records: LogRecord[]; lines: string[] } {
  const records: LogRecord[] = [];
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (!line) continue;
        lines.push(line);
        records.push(JSON.parse(line) as LogRecord);
      }
      cb();
    },
  });
  return { log: pino({ level: 'trace' }, stream), records, lines };
}
