import { pino } from 'pino';

/** What lines are written to: stdout's sonic-boom in the product. */
export interface Destination {
  write(data: string): boolean;
}

/**
 * Where every log line of the process goes (stdout, i.e. the journal under systemd).
 * Ordinary lines are written synchronously, as pino does by default, so nothing is lost
 * on a crash or a watchdog abort. Access lines — one per request, the bulk of the output
 * under load — are batched: they are joined and written once per turn of the event loop,
 * which turns a write(2) per request into one per burst. Before any ordinary line, the
 * pending access lines go out first, so the log keeps its order. Exit flushes what is left;
 * only a SIGKILL can lose the access lines of the current turn.
 */
export class LogSink {
  private pending: string[] = [];
  private scheduled = false;

  constructor(private readonly dest: Destination) {
    process.on('exit', () => this.flush());
  }

  /** pino's entry point: an ordinary line. */
  write(line: string): boolean {
    if (this.pending.length > 0) this.flush();
    return this.dest.write(line);
  }

  /** An access line: written with the others of this event-loop turn. */
  writeBatched(line: string): void {
    this.pending.push(line);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flushScheduled);
    }
  }

  flush(): void {
    if (this.pending.length === 0) return;
    const lines = this.pending.length === 1 ? (this.pending[0] as string) : this.pending.join('');
    this.pending = [];
    this.dest.write(lines);
  }

  private readonly flushScheduled = (): void => {
    this.scheduled = false;
    this.flush();
  };
}

let stdout: LogSink | undefined;

export function stdoutSink(): LogSink {
  stdout ??= new LogSink(pino.destination({ dest: 1, sync: true }));
  return stdout;
}
