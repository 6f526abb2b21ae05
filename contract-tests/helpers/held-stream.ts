import { request } from 'undici';
import { MockGateway, sse } from '../../test/support/mock-gateway.js';
import { deferred, within } from '../../test/support/poll.js';
import { StreamReader } from './sse-client.js';

export interface HeldStream {
  reader: StreamReader;
  /** The upstream's side: more events, then the end. */
  stream: { send: (d: string) => void; end: () => void };
  /** The event the agent has already received. */
  first: string;
}

/**
 * An MCP tool call through the forwarder at `url` answered with an SSE stream the upstream
 * `gw` holds open after one event (received by the agent before this returns): the
 * in-flight stream a disconnect must not cut. Requests after it get a plain JSON answer.
 */
export async function holdStream(gw: MockGateway, url: string): Promise<HeldStream> {
  const up = deferred<{ send: (d: string) => void; end: () => void }>();
  gw.handle((_seen, res) => up.resolve(sse(res)));
  const res = await request(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow"}}',
  });
  const reader = new StreamReader(res.body);
  const stream = await within(up.promise, 10_000, 'the upstream SSE stream');
  const first = 'event: message\ndata: {"progress":1}\n\n';
  stream.send(first);
  await reader.waitForText('"progress":1');
  gw.handle((_seen, r) => {
    r.writeHead(200, { 'content-type': 'application/json' });
    r.end('{"jsonrpc":"2.0","id":1,"result":{}}');
  });
  return { reader, stream, first };
}
