import { existsSync, readFileSync } from 'node:fs';
import { once } from 'node:events';
import { createServer, request, type IncomingHttpHeaders, type RequestListener } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { AppError, errorBody, errorCodes, errorTable, sendError, toAppError, type ErrorCode } from '../src/errors.js';

/** build/test/errors.test.js → project root. */
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** Starts a real HTTP server with `handler`, makes one GET, returns what the client saw. */
async function roundTrip(handler: RequestListener): Promise<Answer> {
  const server = createServer(handler);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  try {
    return await new Promise<Answer>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port, path: '/', method: 'GET', agent: false }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('aborted', () => reject(new Error('response aborted')));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      });
      req.on('error', reject);
      req.end();
    });
  } finally {
    server.closeAllConnections();
    server.close();
  }
}

t.test('every errorTable entry has a 4xx/5xx status and a message', async (t) => {
  t.ok(errorCodes.length > 0);
  t.strictSame([...errorCodes].sort(), Object.keys(errorTable).sort());
  for (const code of errorCodes) {
    const e = errorTable[code];
    t.match(code, /^[a-z][a-z0-9_]*$/, `${code}: snake_case wire name`);
    t.ok(Number.isInteger(e.status) && e.status >= 400 && e.status <= 599, `${code}: status ${e.status} is 4xx/5xx`);
    t.type(e.message, 'string');
    t.ok(e.message.trim().length > 0, `${code}: has a message`);
  }
});

t.test('the codes and statuses SPEC §3 names are in the table', async (t) => {
  const expected: Array<[ErrorCode, number]> = [
    ['method_not_allowed', 405],
    ['unknown_binding', 404],
    ['not_found', 404],
    ['forbidden_host', 403],
    ['forbidden_origin', 403],
    ['payload_too_large', 413],
    ['token_unavailable', 503],
    ['token_rejected', 503],
    ['upstream_unreachable', 502],
    ['upstream_timeout', 504],
    ['internal_error', 500],
  ];
  for (const [code, status] of expected) {
    t.equal(errorTable[code]?.status, status, `${code} → ${status}`);
  }
});

t.test('AppError carries code, status, table message and headers', async (t) => {
  const e = new AppError('token_rejected', undefined, { 'retry-after': '30' });
  t.ok(e instanceof Error);
  t.ok(e instanceof AppError);
  t.equal(e.code, 'token_rejected');
  t.equal(e.status, 503);
  t.equal(e.message, errorTable.token_rejected.message);
  t.strictSame(e.headers, { 'retry-after': '30' });
  const custom = new AppError('payload_too_large', 'custom text');
  t.equal(custom.message, 'custom text');
  t.equal(custom.status, 413);
  t.strictSame(custom.headers, {});
});

t.test('errorBody is exactly {"error","message"}', async (t) => {
  for (const code of errorCodes) {
    const parsed = JSON.parse(errorBody(new AppError(code))) as Record<string, unknown>;
    t.strictSame(Object.keys(parsed).sort(), ['error', 'message']);
    t.equal(parsed.error, code);
    t.equal(parsed.message, errorTable[code].message);
  }
});

t.test('toAppError keeps AppErrors and hides everything else behind internal_error', async (t) => {
  const app = new AppError('not_found');
  t.equal(toAppError(app), app, 'an AppError passes as is');
  const detail = 'connect ECONNREFUSED 10.1.2.3:443 /var/lib/agent-connectors/secret.token tok-SECRET';
  for (const thrown of [new Error(detail), new TypeError(detail), detail, { message: detail }, undefined, null, 42]) {
    const e = toAppError(thrown);
    t.equal(e.code, 'internal_error');
    t.equal(e.status, 500);
    t.equal(e.message, errorTable.internal_error.message);
    t.notMatch(errorBody(e), 'ECONNREFUSED');
    t.notMatch(errorBody(e), 'SECRET');
  }
});

t.test('sendError over a real HTTP server', async (t) => {
  t.test('writes the status, content-type application/json and the JSON body', async (t) => {
    for (const code of errorCodes) {
      const got = await roundTrip((_req, res) => sendError(res, new AppError(code)));
      t.equal(got.status, errorTable[code].status, `${code}: status`);
      t.match(got.headers['content-type'], /^application\/json\b/, `${code}: content-type`);
      t.strictSame(JSON.parse(got.body), { error: code, message: errorTable[code].message }, `${code}: body`);
      t.equal(got.headers['content-length'], String(Buffer.byteLength(got.body)), `${code}: content-length matches`);
    }
  });

  t.test('extra headers pass (allow, retry-after)', async (t) => {
    const a = await roundTrip((_req, res) => sendError(res, new AppError('method_not_allowed'), { allow: 'POST, GET, DELETE' }));
    t.equal(a.status, 405);
    t.equal(a.headers.allow, 'POST, GET, DELETE');
    const b = await roundTrip((_req, res) => sendError(res, new AppError('token_rejected', undefined, { 'retry-after': '30' })));
    t.equal(b.status, 503);
    t.equal(b.headers['retry-after'], '30');
    t.equal(JSON.parse(b.body).error, 'token_rejected');
  });

  t.test('a non-AppError becomes internal_error with no detail', async (t) => {
    const got = await roundTrip((_req, res) => sendError(res, toAppError(new Error('EACCES: /etc/shadow tok-LEAK-999'))));
    t.equal(got.status, 500);
    t.match(got.headers['content-type'], /^application\/json\b/);
    t.strictSame(JSON.parse(got.body), { error: 'internal_error', message: errorTable.internal_error.message });
    t.notMatch(got.body, 'EACCES');
    t.notMatch(got.body, 'tok-LEAK');
  });

  t.test('after headers went out, the connection is cut rather than lying', async (t) => {
    await t.rejects(
      roundTrip((_req, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: partial\n\n', () => sendError(res, new AppError('upstream_unreachable')));
      }),
      'the client sees a truncated response',
    );
  });
});

/**
 * docs/errors.md's error list must match errorTable: the section of it that holds a
 * markdown table whose rows start with "| `<code>` |" and includes `internal_error`.
 */
t.test('docs/errors.md error list and errorTable agree', async (t) => {
  const docPath = `${ROOT}docs/errors.md`;
  if (!existsSync(docPath)) {
    t.fail('docs/errors.md is missing: it must document every error code in a "| `<code>` | ..." table');
    return;
  }
  const lines = readFileSync(docPath, 'utf8').split('\n');
  // Split into sections at headings; pick the one(s) whose table lists internal_error.
  const sections: string[][] = [[]];
  let inFence = false;
  for (const line of lines) {
    if (/^\s*(```|~~~)/.test(line)) inFence = !inFence;
    if (!inFence && /^#{1,6}\s/.test(line)) sections.push([]);
    (sections.at(-1) as string[]).push(line);
  }
  const rowCode = /^\|\s*`([a-z][a-z0-9_]*)`\s*\|/;
  const errorSections = sections.filter((s) => s.some((l) => rowCode.exec(l)?.[1] === 'internal_error'));
  t.ok(errorSections.length > 0, 'docs/errors.md has a table row "| `internal_error` |"');
  const rows = new Map<string, string>();
  for (const s of errorSections) {
    for (const l of s) {
      const code = rowCode.exec(l)?.[1];
      if (code) rows.set(code, l);
    }
  }
  const table = new Set<string>(errorCodes);
  for (const code of errorCodes) {
    t.ok(rows.has(code), `docs/errors.md lists \`${code}\``);
  }
  for (const [code, line] of rows) {
    t.ok(table.has(code), `docs/errors.md row \`${code}\` is in errorTable (${line.trim()})`);
    // When a row states an HTTP status, it must be the table's.
    const statuses = [...line.matchAll(/\b([45]\d\d)\b/g)].map((m) => Number(m[1]));
    if (table.has(code) && statuses.length > 0) {
      t.ok(statuses.includes(errorTable[code as ErrorCode].status), `docs/errors.md status for \`${code}\` is ${errorTable[code as ErrorCode].status}`);
    }
  }
});
