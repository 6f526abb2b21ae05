import { createServer } from 'node:net';
import type { Readable } from 'node:stream';
import { Wakeups } from '../../test/support/wakeups.js';

/** How a response body stream finished, as the agent saw it. */
export type StreamEnd = { kind: 'end' } | { kind: 'error'; error: Error };

/**
 * Reads a response body (undici's `res.body`, a Node Readable) as it arrives and lets a
 * test wait for "the agent has received at least these bytes" with a deadline. Nothing is
 * inferred from timing: a test waits for a condition and fails when the deadline passes.
 */
export class StreamReader {
  private chunks: Buffer[] = [];
  private length = 0;
  private readonly arrivals = new Wakeups();
  private endState: StreamEnd | undefined;
  /** Resolves (never rejects) when the stream ended cleanly or with an error. */
  readonly ended: Promise<StreamEnd>;

  constructor(readonly body: Readable) {
    this.ended = new Promise<StreamEnd>((resolve) => {
      const finish = (state: StreamEnd): void => {
        if (this.endState) return;
        this.endState = state;
        resolve(state);
        this.arrivals.wake();
      };
      body.on('data', (chunk: Buffer | string) => {
        const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
        this.chunks.push(buf);
        this.length += buf.length;
        this.arrivals.wake();
      });
      body.once('end', () => finish({ kind: 'end' }));
      body.once('error', (error: Error) => finish({ kind: 'error', error }));
      body.once('close', () => {
        // A destroyed stream may close without 'end' or 'error' (premature close).
        setImmediate(() => finish({ kind: 'error', error: new Error('closed before end') }));
      });
    });
  }

  get received(): number {
    return this.length;
  }

  text(): string {
    return this.bytes().toString('utf8');
  }

  bytes(): Buffer {
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0] ?? Buffer.alloc(0);
  }

  get finished(): StreamEnd | undefined {
    return this.endState;
  }

  /** Waits until at least `n` bytes have arrived (fails on deadline or an early end). */
  async waitForBytes(n: number, timeoutMs = 10_000): Promise<void> {
    await this.waitFor(() => this.length >= n, `${n} bytes (have ${this.length})`, timeoutMs);
  }

  /** Waits until the received text contains `needle`. */
  async waitForText(needle: string, timeoutMs = 10_000): Promise<void> {
    await this.waitFor(() => this.text().includes(needle), `text ${JSON.stringify(needle)}`, timeoutMs);
  }

  private async waitFor(pred: () => boolean, what: string, timeoutMs: number): Promise<void> {
    await this.arrivals.until(
      () => {
        if (pred()) return true;
        if (this.endState) throw new Error(`stream ended (${this.endState.kind}) before ${what}`);
        return undefined;
      },
      timeoutMs,
      () => `timed out waiting for ${what}`,
    );
  }
}

/** A loopback port that was just free and is now closed (nothing listens on it). */
export async function closedPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const addr = srv.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}
