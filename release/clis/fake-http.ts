import type { ServerResponse } from 'node:http';

/** A JSON answer of a fake SaaS, with its length (the CLIs' own parsers see a whole body). */
export function sendJson(res: ServerResponse, status: number, value: unknown, headers: Readonly<Record<string, string>> = {}): void {
  const text = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', ...headers, 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
