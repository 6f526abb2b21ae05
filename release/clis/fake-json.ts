import type { ServerResponse } from 'node:http';

/** A fake SaaS's JSON answer, with the length set (the CLIs read whole bodies). */
export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
