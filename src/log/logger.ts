import { pino, type Logger } from 'pino';
import { stdoutSink } from './sink.js';

export type { Logger };

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/**
 * The root logger. Redaction is configured here, once: a child's `redact` would replace
 * it. Our code never passes headers or tokens to a logger; the redaction is the second
 * line of defence should a future change do so by mistake.
 */
export function createLogger(level: LogLevel = 'info', name = 'agent-connectors'): Logger {
  return pino(
    {
      name,
      level,
      base: { pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      redact: {
        paths: [
          'token',
          '*.token',
          'authorization',
          '*.authorization',
          '*.headers.authorization',
          '*.headers.cookie',
          'headers.authorization',
          'headers.cookie',
          'credential',
          '*.credential',
        ],
        censor: '[redacted]',
      },
    },
    stdoutSink(),
  );
}
