import t from 'tap';
import { memoryLogger } from '../support/memory-log.js';
import { base64Cores, dropTokenHeaders, holdsToken, tokenNeedles, withoutReflectedToken, WITHHELD_NAME } from '../../src/http/token-reflection.js';
import type { AccessRecord } from '../../src/http/request-pipeline.js';

// `+/=` are percent-encoded by encodeURIComponent, `~!` only by form encoding.
const TOKEN = 'tok-reflect+a/b=c~d!Q7x9Lm2Pz4';
const b64 = (s: string): string => Buffer.from(s).toString('base64');
const b64url = (s: string): string => Buffer.from(s).toString('base64url');
const form = (s: string): string => new URLSearchParams({ t: s }).toString().slice(2);

t.test('holdsToken: raw, URL-encoded, form-encoded, lower-case hex, encoded twice', async (t) => {
  const needles = tokenNeedles(TOKEN);
  const spellings: Record<string, string> = {
    raw: `<https://api.example.com/x?key=${TOKEN}>; rel="next"`,
    encodeURIComponent: `/x?key=${encodeURIComponent(TOKEN)}&page=2`,
    form: `key=${form(TOKEN)}`,
    'lower-case hex': encodeURIComponent(TOKEN).replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase()),
    'encoded twice': encodeURIComponent(encodeURIComponent(TOKEN)),
    'inside a quoted parameter': `Basic realm="${TOKEN}"`,
  };
  for (const [what, value] of Object.entries(spellings)) t.ok(holdsToken(value, needles), what);
  t.notOk(holdsToken('<https://api.example.com/x?page=2>; rel="next"', needles), 'a Link without it');
  t.notOk(holdsToken('%%zz%', needles), 'malformed percent-encoding is no error');
  t.notOk(holdsToken(TOKEN.slice(0, -1), needles), 'all but the last character is not the token');
});

t.test('holdsToken: base64 of the basic pair, token:, :token, the bare token; padded or not; URL alphabet; percent-encoded', async (t) => {
  const needles = tokenNeedles(TOKEN, [`api:${TOKEN}`]);
  for (const pair of [`api:${TOKEN}`, `${TOKEN}:`, `:${TOKEN}`, TOKEN]) {
    t.ok(holdsToken(`Basic ${b64(pair)}`, needles), `base64(${pair.slice(0, 8)}…)`);
    t.ok(holdsToken(b64(pair).replace(/=+$/, ''), needles), 'without padding');
    t.ok(holdsToken(b64url(pair), needles), 'URL alphabet');
    t.ok(holdsToken(encodeURIComponent(b64(pair)), needles), 'percent-encoded base64');
  }
});

t.test('base64Cores: the token is found at any offset inside a longer base64 blob', async (t) => {
  const needles = tokenNeedles(TOKEN);
  for (const prefix of ['', 'u', 'us', 'use', 'user:', '{"client_secret":"']) {
    const blob = b64(`${prefix}${TOKEN}","expires":3600}`);
    t.ok(holdsToken(blob, needles), `after ${JSON.stringify(prefix)}`);
    t.ok(holdsToken(Buffer.from(`${prefix}${TOKEN}!`).toString('base64url'), needles), `URL alphabet after ${JSON.stringify(prefix)}`);
  }
  t.equal(base64Cores(TOKEN).length, 3, 'one core per alignment');
  t.same(base64Cores('short'), [], 'no core for a token too short to tell from chance');
  const short = tokenNeedles('s3cr3t');
  t.ok(holdsToken(b64('s3cr3t:'), short), 'a short token is still found in its exact base64');
  t.notOk(holdsToken(b64('x s3cr3t'), short), 'but not at another offset');
});

t.test('dropTokenHeaders: drops holding values, keeps the rest; a repeated header keeps its clean values', async (t) => {
  const needles = tokenNeedles(TOKEN);
  const out = dropTokenHeaders(
    {
      'content-type': 'application/json',
      link: [`<https://x/?key=${encodeURIComponent(TOKEN)}>; rel="next"`, '<https://x/?page=9>; rel="last"'],
      'x-ratelimit-remaining': '41',
      'x-echo': b64(`${TOKEN}:`),
      vary: [`a-${TOKEN}`, `b-${TOKEN}`],
    },
    needles,
  );
  t.same(out.headers, { 'content-type': 'application/json', link: '<https://x/?page=9>; rel="last"', 'x-ratelimit-remaining': '41' });
  t.same(out.dropped, ['link', 'x-echo', 'vary']);
});

t.test('dropTokenHeaders: a header name holding the token is dropped and its name withheld', async (t) => {
  const out = dropTokenHeaders({ [`x-${TOKEN.toLowerCase()}`]: '1', etag: '"e"' }, tokenNeedles(TOKEN));
  t.same(out.headers, { etag: '"e"' });
  t.same(out.dropped, [WITHHELD_NAME]);
});

t.test('withoutReflectedToken: one warning by header name, never a value; counted on the access record', async (t) => {
  const { log, records, lines } = memoryLogger();
  const rec: AccessRecord = { reqId: 'r1', method: 'GET', bytesIn: 0, bytesOut: 0, outcome: 'ok' };
  const out = withoutReflectedToken({ refresh: `0; url=/x?key=${TOKEN}`, link: TOKEN, etag: '"e"' }, tokenNeedles(TOKEN), rec, log);
  t.same(out, { etag: '"e"' });
  t.equal(rec.tokenHeadersDropped, 2);
  const warnings = records.filter((l) => l.msg === 'dropped response headers holding the token');
  t.equal(warnings.length, 1, 'one line per response');
  t.same(warnings[0]?.headers, ['refresh', 'link']);
  t.notOk(lines.join('\n').includes(TOKEN), 'no token in the log');

  const clean: AccessRecord = { reqId: 'r2', method: 'GET', bytesIn: 0, bytesOut: 0, outcome: 'ok' };
  withoutReflectedToken({ etag: '"e"' }, tokenNeedles(TOKEN), clean, log);
  t.equal(clean.tokenHeadersDropped, undefined);
  t.equal(records.filter((l) => l.msg === 'dropped response headers holding the token').length, 1, 'nothing logged for a clean answer');
});

t.test('withoutReflectedToken: a token anywhere (name, value, one of a repeated header) is caught; a clean answer keeps every header', async (t) => {
  const { log } = memoryLogger();
  const rec = (): AccessRecord => ({ reqId: 'r', method: 'GET', bytesIn: 0, bytesOut: 0, outcome: 'ok' });
  const b64 = Buffer.from(`user:${TOKEN}`).toString('base64');
  const dirty: Array<Record<string, string | string[]>> = [
    { [`x-${TOKEN.toLowerCase()}`]: '1', etag: '"e"' },
    { link: ['<a>', `<b?t=${encodeURIComponent(TOKEN)}>`], etag: '"e"' },
    { 'x-echo': b64, etag: '"e"' },
  ];
  for (const h of dirty) {
    const r = rec();
    const out = withoutReflectedToken({ ...h }, tokenNeedles(TOKEN), r, log);
    t.ok(Number(r.tokenHeadersDropped ?? 0) > 0, 'counted');
    t.notOk(JSON.stringify(out).includes(TOKEN) || JSON.stringify(out).toLowerCase().includes(TOKEN.toLowerCase()), 'not passed on');
    t.equal(out.etag, '"e"', 'the rest kept');
  }
  const clean = { etag: '"e"', link: ['<a>', '<b>'], 'content-type': 'application/json' };
  const r = rec();
  t.strictSame(withoutReflectedToken({ ...clean }, tokenNeedles(TOKEN), r, log), clean);
  t.equal(r.tokenHeadersDropped, undefined);
});
