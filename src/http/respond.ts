import type { ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';
import type { HeaderRecord } from './headers.js';
import type { UpstreamResponse } from './dispatch.js';

export type StreamOutcome = 'ok' | 'client_closed' | 'upstream_failed';

/**
 * Sends the upstream's status and (already filtered) headers to the agent at once, then
 * streams the body chunk by chunk. `flushHeaders` matters for SSE: an open stream with no
 * event yet must still give the agent its headers. `pipeline` gives backpressure: a slow
 * agent slows the upstream read. A failure after headers destroys the agent connection,
 * the only signal left that the body is incomplete.
 */
export async function streamResponse(
  res: ServerResponse,
  upstream: UpstreamResponse,
  headers: HeaderRecord,
  onBytes: (n: number) => void,
): Promise<StreamOutcome> {
  res.writeHead(upstream.statusCode, headers);
  res.flushHeaders();
  upstream.body.on('data', (chunk: Buffer) => onBytes(chunk.length));
  try {
    await pipeline(upstream.body, res);
    return 'ok';
  } catch {
    if (res.destroyed && !res.writableFinished && !upstream.body.errored) return 'client_closed';
    res.destroy();
    return 'upstream_failed';
  }
}
