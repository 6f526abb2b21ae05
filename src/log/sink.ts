import { pino } from 'pino';

/** What lines are written to: stdout's sonic-boom in the product. */
export interface Destination {
  write(data: string): boolean;
}

/** Pending access lines are written at the latest this long after the first of them… */
export const ACCESS_FLUSH_MS = 20;
/** …or as soon as they add up to this many characters. */
export const ACCESS_FLUSH_CHARS = 32 * 1024;

/**
 * Where every log line of the process goes (stdout, i.e. the journal under systemd).
 * Ordinary lines are written synchronously, as pino does by default, so nothing is lost
 * on a crash or a watchdog abort. Access lines — one per request, the bulk of the output
 * under load — are buffered and written together every ACCESS_FLUSH_MS (or every
 * ACCESS_FLUSH_CHARS): one write(2) for a burst of requests instead of one each, like
 * nginx's `access_log … buffer= flush=`. Before any ordinary line the pending access
 * lines go out first, so the log keeps its order; exit flushes what is left. Only a
 * SIGKILL (or a watchdog SIGABRT) can lose access lines: those of the last 20 ms.
 */
export class LogSink {
  private pending: string[] = [];
  private pendingChars = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly dest: Destination) {
    process.on('exit', () => this.flush());
  }

  /** pino's entry point: an ordinary line. */
  write(line: string): boolean {
    if (this.pending.length > 0) this.flush();
    return this.dest.write(line);
  }

  /** An access line: written with the others of its 20 ms window. */
  writeBatched(line: string): void {
    this.pending.push(line);
    this.pendingChars += line.length;
    if (this.pendingChars >= ACCESS_FLUSH_CHARS) this.flush();
    else this.timer ??= setTimeout(this.flushNow, ACCESS_FLUSH_MS).unref();
  }

  flush(): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    if (this.pending.length === 0) return;
    const lines = this.pending.length === 1 ? (this.pending[0] as string) : this.pending.join('');
    this.pending = [];
    this.pendingChars = 0;
    this.dest.write(lines);
  }

  private readonly flushNow = (): void => {
    this.timer = undefined;
    this.flush();
  };
}

let stdout: LogSink | undefined;

export function stdoutSink(): LogSink {
  stdout ??= new LogSink(pino.destination({ dest: 1, sync: true }));
  return stdout;
}
