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
  // The pieces of the window's lines: the first `count` entries (any past them are stale,
  // cut at the write). The array keeps its store from window to window (emptied by
  // filling, never to length 0, which frees the store): regrowing it for each window cost
  // more garbage than the lines themselves.
  private readonly pending: string[] = [];
  private count = 0;
  private pendingChars = 0;
  // One timer for the life of the sink, re-armed with refresh() at the first line after a
  // write: no Timeout object, async resource and list entry built per window. Never
  // cleared: when an earlier write (the size bound, an ordinary line) has taken the lines,
  // it fires on an empty queue and writes nothing. A line waits at most ACCESS_FLUSH_MS
  // either way: the timer pending when it arrived was armed no earlier than the window's
  // first line.
  private timer: NodeJS.Timeout | undefined;
  private armed = false;

  constructor(private readonly dest: Destination) {
    process.on('exit', () => this.flush());
  }

  /** pino's entry point: an ordinary line. */
  write(line: string): boolean {
    if (this.count > 0) this.flush();
    return this.dest.write(line);
  }

  /** An access line: written with the others of its 20 ms window. */
  writeBatched(line: string): void {
    this.part(line);
    this.endLine();
  }

  /**
   * A piece of the access line being written, in order; `endLine()` after its last piece.
   * The pieces are joined once, for the whole window, at the write: building each line as
   * a string first cost a chain of concatenations and a copy per line (docs/performance.md,
   * session 13). Only the access writer calls these, synchronously from the line's first
   * piece to endLine(), so no write (nor the exit flush) can fall inside a line.
   */
  part(piece: string): void {
    this.pending[this.count++] = piece;
    this.pendingChars += piece.length;
  }

  endLine(): void {
    if (this.pendingChars >= ACCESS_FLUSH_CHARS) this.flush();
    else if (!this.armed) {
      this.armed = true;
      if (this.timer) this.timer.refresh();
      else this.timer = setTimeout(this.flushNow, ACCESS_FLUSH_MS).unref();
    }
  }

  flush(): void {
    if (this.count === 0) return;
    const p = this.pending;
    // Cut to the window (join's scratch is as long as the array). A shorter length keeps
    // the store unless it is far larger; a longer window appends into it.
    if (p.length !== this.count) p.length = this.count;
    const lines = this.count === 1 ? (p[0] as string) : p.join('');
    // The pieces let go at once, the length kept.
    p.fill('', 0, this.count);
    this.count = 0;
    this.pendingChars = 0;
    this.dest.write(lines);
  }

  private readonly flushNow = (): void => {
    this.armed = false;
    this.flush();
  };
}

let stdout: LogSink | undefined;

export function stdoutSink(): LogSink {
  stdout ??= new LogSink(pino.destination({ dest: 1, sync: true }));
  return stdout;
}
