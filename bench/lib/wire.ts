/** What the bench upstream and its clients agree on (paths, event format, stats). */

/** The request body of the JSON test: a 1 KB JSON-RPC call. */
export const JSON_REQUEST = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'tools/call',
  params: { name: 'bench', arguments: { pad: 'y'.repeat(940) } },
});

/** The answer: a 1 KB JSON-RPC result. */
export const JSON_RESPONSE = Buffer.from(
  JSON.stringify({ jsonrpc: '2.0', id: 1, result: { content: [{ type: 'text', text: 'x'.repeat(960) }] } }),
);

/** One SSE event as sent by the upstream: `s` stream id, `n` sequence, `t` send time (hrtime ns), `a` last ack seen. */
export interface SseEvent {
  s: string;
  n: number;
  t: string;
  a: number;
}

export function sseEventText(e: SseEvent, pad: string): string {
  return `id: ${e.n}\ndata: ${JSON.stringify({ ...e, p: pad })}\n\n`;
}

export interface PortStats {
  requests: number;
  /** Bytes of the current (or last) large body written to the socket so far. */
  bigWritten: number;
  bigDone: boolean;
  idleOpen: number;
  sseOpen: number;
  /** TCP connections open on this port right now (busy or idle keep-alive). */
  connections: number;
}

export interface UpstreamHello {
  ports: number[];
  pid: number;
}
