import { writeSync } from 'node:fs';
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

  /**
   * `fd`: the descriptor `dest` writes to synchronously (stdout's sonic-boom), so a batch
   * can be written to it directly. sonic-boom's write of a batch measured the string's
   * length, wrote it, then encoded it once more into a Buffer only to slice off what was
   * written: ≈ 1.2 µs per access line on top of the write itself (docs/performance.md).
   * Both writers are synchronous and sonic-boom holds nothing between writes, so the
   * log's order is kept.
   */
  constructor(
    private readonly dest: Destination,
    private fd?: number,
  ) {
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
    if (this.fd === undefined) this.dest.write(lines);
    else this.writeDirect(this.fd, lines);
  }

  /**
   * The whole batch to `fd`, as sonic-boom's synchronous mode would write it: the rest
   * after a short write, a pause and another try on EAGAIN (a non-blocking pipe that is
   * full). Any other error hands what is left to the destination, and every later batch
   * too, so its own handling applies (pino's makes a broken pipe's writes no-ops).
   */
  private writeDirect(fd: number, lines: string): void {
    let buf: Buffer | undefined;
    let off = 0;
    for (;;) {
      try {
        if (buf === undefined) {
          const n = writeSync(fd, lines);
          if (n === Buffer.byteLength(lines)) return;
          buf = Buffer.from(lines);
          off = n;
        } else {
          off += writeSync(fd, buf, off);
          if (off >= buf.length) return;
        }
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'EAGAIN') {
          Atomics.wait(PAUSE, 0, 0, BUSY_WRITE_MS);
          continue;
        }
        this.fd = undefined;
        this.dest.write(buf === undefined ? lines : buf.subarray(off).toString());
        return;
      }
    }
  }

  private readonly flushNow = (): void => {
    this.timer = undefined;
    this.flush();
  };
}

/** sonic-boom's pause before writing again to a full non-blocking descriptor. */
const BUSY_WRITE_MS = 100;
const PAUSE = new Int32Array(new SharedArrayBuffer(4));

let stdout: LogSink | undefined;

export function stdoutSink(): LogSink {
  stdout ??= new LogSink(pino.destination({ dest: 1, sync: true }), 1);
  return stdout;
}
