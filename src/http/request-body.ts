import type { IncomingMessage } from 'node:http';
import { AppError, ClientGoneError } from '../errors.js';

export const DEFAULT_BODY_LIMIT = 4 * 1024 * 1024;

/** How long an over-limit upload may keep draining after the 413 went out. */
const DRAIN_GRACE_MS = 10_000;

const EMPTY = Buffer.alloc(0);

/**
 * Buffers a request body up to `limit` bytes. Bodies are small JSON-RPC messages, and the
 * 401 retry must be able to send them twice, so buffering is the design, not a shortcut.
 *
 * Over the limit (declared or counted, chunked included) it rejects with
 * payload_too_large at once but keeps draining the upload for a while: a client still
 * writing then reads the 413 instead of a connection reset, and the connection stays
 * usable for keep-alive once the body has been discarded.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > limit) {
    drain(req);
    return Promise.reject(new AppError('payload_too_large'));
  }
  if (req.readableEnded) return Promise.resolve(EMPTY);
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = (): void => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        chunks.length = 0;
        drain(req);
        reject(new AppError('payload_too_large'));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = (): void => {
      cleanup();
      resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size));
    };
    const onError = (): void => {
      cleanup();
      reject(new ClientGoneError());
    };
    const onClose = (): void => {
      if (!req.complete) onError();
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

function drain(req: IncomingMessage): void {
  const timer = setTimeout(() => req.socket.destroy(), DRAIN_GRACE_MS);
  timer.unref();
  req.once('end', () => clearTimeout(timer));
  req.once('close', () => clearTimeout(timer));
  req.resume();
}
