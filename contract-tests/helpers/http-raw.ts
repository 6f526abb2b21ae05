import { connect, type Socket } from 'node:net';
import { request } from 'undici';
import type { TapTest } from '../../test/support/tap.js';
import { Wakeups } from '../../test/support/wakeups.js';

/** One HTTP response as the agent saw it: status, lower-cased headers, body text. */
export interface Resp {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  /** Everything the agent could read: status, header names and values, body. */
  text: string;
}

function respText(status: number, headers: Resp['headers'], body: string): string {
  const h = Object.entries(headers)
    .map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(', ') : (v ?? '')}`)
    .join('\n');
  return `${status}\n${h}\n\n${body}`;
}

export interface SendOptions {
  method?: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
}

/** A plain agent request through undici (no redirects, no decompression), body read whole. */
export async function send(url: string, opts: SendOptions = {}): Promise<Resp> {
  const res = await request(url, {
    method: (opts.method ?? 'POST') as 'POST',
    headers: opts.headers ?? { 'content-type': 'application/json' },
    body: opts.body ?? (opts.method === undefined || opts.method === 'POST' ? '{"jsonrpc":"2.0","id":1,"method":"ping"}' : undefined),
  });
  const body = await res.body.text();
  return { status: res.statusCode, headers: res.headers, body, text: respText(res.statusCode, res.headers, body) };
}

function header(resp: Resp, name: string): string | undefined {
  const v = resp.headers[name];
  return Array.isArray(v) ? v.join(', ') : v;
}

/**
 * The one shape of every error answer (SPEC §3 Routes): `content-type: application/json`
 * and a body that is exactly `{"error":<code>,"message":<string>}`.
 */
export function assertJsonError(t: TapTest, resp: Resp, status: number, code: string | readonly string[], what = ''): void {
  const p = what ? `${what}: ` : '';
  t.equal(resp.status, status, `${p}status ${status}`);
  t.match(header(resp, 'content-type') ?? '', /^application\/json(;|$)/, `${p}content-type is application/json`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(resp.body);
  } catch {
    t.fail(`${p}error body is JSON, got ${JSON.stringify(resp.body.slice(0, 200))}`);
    return;
  }
  t.ok(parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed), `${p}error body is an object`);
  const obj = parsed as Record<string, unknown>;
  t.same(Object.keys(obj).sort(), ['error', 'message'], `${p}error body has exactly error and message`);
  const codes = typeof code === 'string' ? [code] : code;
  t.ok(typeof obj.error === 'string' && codes.includes(obj.error), `${p}error code ${codes.join('|')} (got ${String(obj.error)})`);
  t.equal(typeof obj.message, 'string', `${p}message is a string`);
}

/** Parses one complete HTTP/1.x response from the front of `buf`; null when incomplete. */
export function parseResponse(buf: Buffer, closed: boolean): { resp: Resp; rest: Buffer } | null {
  const end = buf.indexOf('\r\n\r\n');
  if (end === -1) return null;
  const head = buf.subarray(0, end).toString('latin1');
  const [statusLine = '', ...lines] = head.split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine);
  if (!m?.[1]) throw new Error(`not an HTTP response: ${JSON.stringify(statusLine)}`);
  const status = Number(m[1]);
  const headers: Resp['headers'] = {};
  for (const line of lines) {
    const i = line.indexOf(':');
    if (i === -1) continue;
    const name = line.slice(0, i).trim().toLowerCase();
    const value = line.slice(i + 1).trim();
    const prev = headers[name];
    headers[name] = prev === undefined ? value : Array.isArray(prev) ? [...prev, value] : [prev, value];
  }
  let offset = end + 4;
  let body: Buffer;
  const te = headers['transfer-encoding'];
  const cl = headers['content-length'];
  if (status < 200 || status === 204 || status === 304) {
    body = Buffer.alloc(0);
  } else if (typeof te === 'string' && /chunked/i.test(te)) {
    const parts: Buffer[] = [];
    for (;;) {
      const lineEnd = buf.indexOf('\r\n', offset);
      if (lineEnd === -1) return null;
      const size = parseInt(buf.subarray(offset, lineEnd).toString('latin1'), 16);
      if (Number.isNaN(size)) throw new Error('bad chunk size');
      if (size === 0) {
        // "0\r\n" then optional trailer lines, then an empty line.
        const trailerEnd = buf.indexOf('\r\n\r\n', lineEnd);
        if (trailerEnd === -1) return null;
        offset = trailerEnd + 4;
        break;
      }
      if (buf.length < lineEnd + 2 + size + 2) return null;
      parts.push(buf.subarray(lineEnd + 2, lineEnd + 2 + size));
      offset = lineEnd + 2 + size + 2;
    }
    body = Buffer.concat(parts);
  } else if (typeof cl === 'string') {
    const n = Number(cl);
    if (buf.length < offset + n) return null;
    body = buf.subarray(offset, offset + n);
    offset += n;
  } else {
    if (!closed) return null;
    body = buf.subarray(offset);
    offset = buf.length;
  }
  const bodyText = body.toString('utf8');
  return { resp: { status, headers, body: bodyText, text: respText(status, headers, bodyText) }, rest: buf.subarray(offset) };
}

/**
 * A raw TCP connection to a loopback HTTP server, for what an HTTP client library will not
 * do: a missing or hostile Host, an upload that goes on after the answer, keep-alive
 * reuse of one socket, oversized headers.
 */
export class RawConnection {
  private buf: Buffer = Buffer.alloc(0);
  private readonly arrivals = new Wakeups();
  closed = false;
  error: Error | undefined;

  private constructor(readonly socket: Socket) {
    socket.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.arrivals.wake();
    });
    socket.on('error', (err) => {
      this.error = err;
    });
    socket.on('close', () => {
      this.closed = true;
      this.arrivals.wake();
    });
  }

  static open(port: number, host = '127.0.0.1'): Promise<RawConnection> {
    return new Promise((resolve, reject) => {
      const s = connect({ port, host, noDelay: true });
      s.once('connect', () => {
        s.off('error', reject);
        resolve(new RawConnection(s));
      });
      s.once('error', reject);
    });
  }

  /** Writes and resolves once the data was handed to the kernel. */
  write(data: string | Buffer): Promise<void> {
    return new Promise((resolve, reject) => {
      this.socket.write(data, (err) => (err ? reject(err) : resolve()));
    });
  }

  /** True when a complete response is waiting to be read (does not consume it). */
  hasResponse(): boolean {
    return parseResponse(this.buf, this.closed) !== null;
  }

  /** Reads (consumes) the next complete response, waiting up to `timeoutMs`. */
  async readResponse(timeoutMs = 10_000): Promise<Resp> {
    const got = (): string => JSON.stringify(this.buf.toString('latin1').slice(0, 200));
    return this.arrivals.until(
      () => {
        const parsed = parseResponse(this.buf, this.closed);
        if (parsed) {
          this.buf = parsed.rest;
          return parsed.resp;
        }
        if (this.closed) throw new Error(`connection closed before a complete response (${this.error?.message ?? 'EOF'}); got ${got()}`);
        return undefined;
      },
      timeoutMs,
      () => `timed out waiting for a response; got ${got()}`,
    );
  }

  destroy(): void {
    this.socket.destroy();
  }
}

/** Sends one raw request on a fresh connection and reads one response. */
export async function rawExchange(port: number, requestText: string | Buffer, timeoutMs = 10_000): Promise<Resp> {
  const conn = await RawConnection.open(port);
  try {
    await conn.write(requestText);
    return await conn.readResponse(timeoutMs);
  } finally {
    conn.destroy();
  }
}
