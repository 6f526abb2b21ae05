/** A body cut off at its bound: what was read is dropped, the stream destroyed. */
export class BodyTooLargeError extends Error {
  constructor(readonly maxBytes: number) {
    super(`answer larger than ${maxBytes} bytes`);
    this.name = 'BodyTooLargeError';
  }
}

/**
 * Reads an HTTP body (undici's `res.body`, any readable stream) as UTF-8, never holding more
 * than `maxBytes`: past the bound the stream is destroyed (the connection goes with it) and
 * BodyTooLargeError thrown. `.text()`/`.json()` would collect whatever the peer sends; a
 * squatter on a stopped part's port streaming `/healthz` took the link to 8.3 GB that way.
 */
export async function readBodyBounded(body: AsyncIterable<unknown> & { destroy(err?: Error): unknown }, maxBytes: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as Uint8Array);
    size += buf.length;
    if (size > maxBytes) {
      body.destroy();
      throw new BodyTooLargeError(maxBytes);
    }
    chunks.push(buf);
  }
  return Buffer.concat(chunks, size).toString('utf8');
}
