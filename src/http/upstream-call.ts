import type { ServerResponse } from 'node:http';
import type { Readable } from 'node:stream';
import type { Agent, Dispatcher } from 'undici';
import { ClientGoneError, mapUpstreamError } from '../errors.js';
import type { HeaderRecord } from './headers.js';

/** Where a request goes, split once per config load rather than parsed per request. */
export interface UpstreamTarget {
  origin: string;
  /** Path and query, as sent on the request line. */
  path: string;
}

export function upstreamTarget(url: URL): UpstreamTarget {
  return { origin: url.origin, path: url.pathname + url.search };
}

export interface UpstreamRequest {
  target: UpstreamTarget;
  method: string;
  /** A record, or a flat list ([name, value, …]) as filterRawHeaderList gives. */
  headers: HeaderRecord | string[];
  body: Buffer | Readable | null;
}

export interface UpstreamHead {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
}

export type StreamOutcome = 'ok' | 'client_closed' | 'upstream_failed';

/** Body bytes held while the caller has not decided what to do with the response yet. */
const EARLY_LIMIT = 64 * 1024;
/** A rejected (401) answer's body is read to keep the connection reusable, up to this much. */
const DISCARD_LIMIT = 128 * 1024;

type State = 'waiting' | 'head' | 'piping' | 'discarding' | 'done';

/**
 * One upstream exchange on undici's dispatch-handler interface, writing body chunks
 * straight from the HTTP parser into the agent's response. Why not `agent.request` and
 * `stream.pipeline`: per request they cost a body Readable, an AbortController, a
 * pipeline with its own abort plumbing and an extra header write — together more than
 * the rest of the proxy (docs/performance.md). Backpressure is the parser's: a `false`
 * from `res.write` pauses the upstream socket until the agent drains.
 *
 * The agent leaving (the response closing before it finished) aborts the upstream
 * request, before or after its headers; the upstream sees its connection close.
 */
export class UpstreamCall implements Dispatcher.DispatchHandler {
  /** Resolves at the upstream's final response headers; rejects with an AppError or ClientGoneError. */
  readonly head: Promise<UpstreamHead>;
  bytesOut = 0;

  private state: State = 'waiting';
  private controller: Dispatcher.DispatchController | undefined;
  private clientGone = false;
  private abandoned = false;
  private early: Buffer[] = [];
  private earlyBytes = 0;
  private ended = false;
  private failed = false;
  private wrote = false;
  private discarded = 0;
  // Dropped once the head is settled: a stream holds its call for hours.
  private resolveHead: ((head: UpstreamHead) => void) | undefined;
  private rejectHead: ((err: unknown) => void) | undefined;
  private settle: ((outcome: StreamOutcome) => void) | undefined;

  // Either the agent left, or the caller answered it without this call (an error found
  // after the upstream's head): either way the upstream request has nobody to go to.
  private readonly onClose = (): void => {
    this.clientGone = !this.res.writableFinished;
    this.abandoned = true;
    this.controller?.abort(new ClientGoneError());
  };

  private readonly onDrain = (): void => {
    this.controller?.resume();
  };

  constructor(
    agent: Agent,
    req: UpstreamRequest,
    private readonly res: ServerResponse,
  ) {
    this.head = new Promise<UpstreamHead>((resolve, reject) => {
      this.resolveHead = resolve;
      this.rejectHead = reject;
    });
    if (res.destroyed) {
      // The agent already left (e.g. during a first attempt): nothing to send for.
      this.clientGone = true;
      this.abandoned = true;
      this.state = 'done';
      this.failHead(new ClientGoneError());
      return;
    }
    res.once('close', this.onClose);
    try {
      agent.dispatch(
        { origin: req.target.origin, path: req.target.path, method: req.method as Dispatcher.HttpMethod, headers: req.headers, body: req.body },
        this,
      );
    } catch (err) {
      this.finish();
      this.failHead(mapUpstreamError(err, false));
    }
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    // The agent left while the request was still queued for a connection.
    if (this.abandoned) controller.abort(new ClientGoneError());
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number, headers: UpstreamHead['headers']): void {
    if (statusCode < 200) return; // informational; the final answer follows
    this.state = 'head';
    const resolve = this.resolveHead;
    this.resolveHead = this.rejectHead = undefined;
    resolve?.({ statusCode, headers });
  }

  private failHead(err: unknown): void {
    const reject = this.rejectHead;
    this.resolveHead = this.rejectHead = undefined;
    reject?.(err);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    switch (this.state) {
      case 'piping':
        this.bytesOut += chunk.length;
        this.wrote = true;
        if (!this.res.write(chunk)) controller.pause();
        return;
      case 'head':
        this.early.push(chunk);
        this.earlyBytes += chunk.length;
        if (this.earlyBytes >= EARLY_LIMIT) controller.pause();
        return;
      case 'discarding':
        this.discarded += chunk.length;
        if (this.discarded > DISCARD_LIMIT) controller.abort(new ClientGoneError());
        return;
      default:
        return;
    }
  }

  onResponseEnd(): void {
    switch (this.state) {
      case 'piping':
        this.res.end();
        this.done('ok');
        return;
      case 'discarding':
        this.done('ok');
        return;
      default:
        this.ended = true;
    }
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    switch (this.state) {
      case 'waiting':
        this.finish();
        this.failHead(mapUpstreamError(err, this.clientGone));
        return;
      case 'piping':
        if (!this.clientGone) this.res.destroy();
        this.done(this.clientGone ? 'client_closed' : 'upstream_failed');
        return;
      case 'discarding':
        this.done('ok');
        return;
      default:
        this.failed = true;
    }
  }

  /**
   * Sends the status and (already filtered) headers to the agent, then the body as it
   * arrives. Headers travel with the first body chunk; when no chunk is there yet they go
   * out on their own at the next turn of the event loop, so an SSE stream whose upstream
   * is silent still gives the agent its headers. A failure after headers destroys the
   * agent connection: the only signal left that the body is incomplete.
   */
  pipe(statusCode: number, headers: HeaderRecord): Promise<StreamOutcome> {
    const { res } = this;
    if (this.abandoned) return Promise.resolve(this.done('client_closed'));
    try {
      res.writeHead(statusCode, headers);
    } catch (err) {
      // Node refused a header value: nothing went out; the caller answers with an error.
      this.controller?.abort(new ClientGoneError());
      this.finish();
      throw err;
    }
    if (this.failed) {
      res.destroy();
      return Promise.resolve(this.done('upstream_failed'));
    }
    const early = this.early;
    this.early = [];
    for (const chunk of early) this.bytesOut += chunk.length;
    if (this.ended) {
      if (early.length <= 1) res.end(early[0]);
      else {
        res.cork();
        for (const chunk of early) res.write(chunk);
        res.end();
      }
      return Promise.resolve(this.done('ok'));
    }
    let writable = true;
    for (const chunk of early) writable = res.write(chunk);
    this.wrote = early.length > 0;
    if (!this.wrote) {
      setImmediate(() => {
        if (!this.wrote && this.state === 'piping' && !res.destroyed) res.flushHeaders();
      });
    }
    this.state = 'piping';
    res.on('drain', this.onDrain);
    if (writable) this.controller?.resume();
    return new Promise<StreamOutcome>((resolve) => {
      this.settle = resolve;
    });
  }

  /** Reads and drops the body (bounded), leaving the agent's response untouched. */
  discard(): Promise<void> {
    this.early = [];
    if (this.ended || this.failed) {
      this.done('ok');
      return Promise.resolve();
    }
    this.state = 'discarding';
    this.controller?.resume();
    return new Promise<void>((resolve) => {
      this.settle = () => resolve();
    });
  }

  private done(outcome: StreamOutcome): StreamOutcome {
    this.finish();
    const settle = this.settle;
    this.settle = undefined;
    settle?.(outcome);
    return outcome;
  }

  private finish(): void {
    this.state = 'done';
    this.res.off('close', this.onClose);
    this.res.off('drain', this.onDrain);
  }
}
