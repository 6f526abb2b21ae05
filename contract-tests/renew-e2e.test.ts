import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import t from 'tap';
import { Agent, request } from 'undici';
import type { RenewAuthority } from '../src/dev/demo-gateway/authority.js';
import {
  checkNoLeaks,
  knownSecrets,
  leakedSecrets,
  startCli,
  type CliProc,
} from '../test/support/cli-proc.js';
import { bearerToken, McpUpstream } from './helpers/mcp-upstream.js';
import { MockRenewGateway } from '../test/support/mock-renew-gateway.js';
import { until } from '../test/support/poll.js';
import { startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';

/**
 * Renewal end to end (SPEC §4 with §3): `renew fetch` (loop) + `renew apply --watch`
 * against the mock Gateway keep a running forwarder's token file fresh while traffic
 * flows; the upstream checks every bearer token with the mock Gateway's own authority.
 */

/** A host credential, remembered as a secret. */
function newCredential(): string {
  const credential = `hostcred-${randomBytes(24).toString('base64url')}`;
  knownSecrets.add(credential);
  return credential;
}

/**
 * Wraps the authority's `renew` so every token it hands out becomes a known secret (the
 * leak checks search for all of them), and so the answer advertises a shorter lifetime
 * than the authority enforces: `expiresAt` = mint time + `advertisedMs`.
 *
 * Why: fetch schedules on the advertised expiry (renew when a third is left), so a 300 ms
 * advertised lifetime rotates the token every ~200 ms; the authority keeps honouring a
 * token for its full `tokenLifetimeMs`, a grace period past the advertised expiry, as a
 * Gateway allowing for clock skew does. Without the grace, "valid" would also assert that
 * three processes and six fsyncs always finish within the last 100 ms of a token's life,
 * a timing assertion a loaded CI host cannot keep. How late tokens actually arrived
 * (after the advertised expiry) is measured and reported, not asserted.
 */
/** Whether an SSE body holds the progress event and then the result for `id`, in order. */
function sseResultFor(text: string, id: string): boolean {
  const data = text
    .split('\n\n')
    .filter((e) => e.includes('data: '))
    .map((e) => JSON.parse(e.slice(e.indexOf('data: ') + 6)) as { id?: unknown; method?: unknown });
  return data.length === 2 && data[0]?.method === 'notifications/progress' && data[1]?.id === id;
}

/** The p-th percentile (nearest rank) of `values`, rounded to 0.1 ms; NaN for none. */
function pct(values: number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const v = sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? Number.NaN;
  return Math.round(v * 10) / 10;
}

/** When the Gateway minted each token id (first answer only; replays repeat it). */
const mintTimes = new Map<string, number>();
/** Which token id each minted token is (the refused ones too), for the failure dump. */
const tokenIdOf = new Map<string, string>();

function advertiseLifetime(authority: RenewAuthority, advertisedMs: number): Map<string, number> {
  const advertised = new Map<string, number>();
  const renew = authority.renew.bind(authority);
  authority.renew = (slot, bearer, body) => {
    const result = renew(slot, bearer, body);
    if (result.status === 200 && 'token' in result.body) {
      knownSecrets.add(result.body.token);
      if (!mintTimes.has(result.body.tokenId)) mintTimes.set(result.body.tokenId, Date.now());
      tokenIdOf.set(result.body.token, result.body.tokenId);
      // Deterministic per answer, so a replayed requestId gets the same body.
      const mintedAt = Date.parse(result.body.expiresAt) - authority.tokenLifetimeMs;
      const expiresAt = mintedAt + advertisedMs;
      advertised.set(result.body.token, expiresAt);
      result.body = { ...result.body, expiresAt: new Date(expiresAt).toISOString() };
    }
    return result;
  };
  return advertised;
}

/** What an upstream saw of one request's bearer token. */
interface Seen {
  valid: boolean;
  tokenId: string | undefined;
  sessionId: string | undefined;
  method: string;
  rpcMethod: string | undefined;
  /** Why an invalid token was invalid (never the token itself). */
  problem?: string;
  /** A valid token that arrived after its advertised expiry: by how much (ms). */
  lateMs?: number;
  /** When the upstream saw it (Date.now), and which minted token it carried: for the failure dump. */
  at?: number;
  carried?: string | undefined;
}

const TOKEN_SHAPE = /^gw_[A-Za-z0-9_-]{43}$/;

/** Checks a request's bearer token (undefined without one) with the Gateway's authority, as the real Gateway would. */
function checkBearer(
  token: string | undefined,
  authority: RenewAuthority,
  advertised: Map<string, number>,
): { ok: true; tokenId: string; lateMs: number } | { ok: false; problem: string } {
  if (token === undefined) return { ok: false, problem: 'no bearer token' };
  const valid = authority.isValidToken(token);
  const exp = advertised.get(token);
  if (valid) return { ok: true, tokenId: valid.tokenId, lateMs: exp === undefined ? 0 : Math.max(0, Date.now() - exp) };
  if (!TOKEN_SHAPE.test(token)) return { ok: false, problem: `partial or malformed token (${token.length} chars)` };
  // The Gateway honours only a slot's newest token: a refused token it minted was
  // superseded by a renewal (the forwarder's 401 bridge retries those) or has expired.
  return { ok: false, problem: exp !== undefined ? 'superseded or expired' : 'unknown token' };
}

async function listen(server: Server): Promise<number> {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return (server.address() as AddressInfo).port;
}

/** A plain JSON upstream that answers 200 to a valid token and 401 (recorded) to anything else. */
class CheckingUpstream {
  readonly seen: Seen[] = [];
  readonly invalid: Seen[] = [];
  readonly tokenIds = new Set<string>();
  port = 0;
  private readonly server: Server;

  constructor(
    private readonly authority: RenewAuthority,
    private readonly advertised: Map<string, number>,
  ) {
    this.server = createServer((req, res) => void this.onRequest(req, res));
  }

  async start(): Promise<this> {
    this.port = await listen(this.server);
    return this;
  }

  url(): string {
    return `http://127.0.0.1:${this.port}/mcp`;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // Checked on arrival, before the body: the moment the Gateway would check it.
    const check = checkBearer(bearerToken(req.headers.authorization), this.authority, this.advertised);
    const arrivedAt = Date.now();
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    let id: unknown = null;
    let rpcMethod: unknown;
    try {
      const msg = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id?: unknown; method?: unknown };
      id = msg.id ?? null;
      rpcMethod = msg.method;
    } catch {
      id = null;
    }
    const token = bearerToken(req.headers.authorization);
    const seen: Seen = {
      valid: check.ok, tokenId: check.ok ? check.tokenId : undefined, sessionId: undefined, method: req.method ?? '', rpcMethod: undefined,
      at: arrivedAt, carried: token === undefined ? undefined : tokenIdOf.get(token),
    };
    if (check.ok && check.lateMs > 0) seen.lateMs = check.lateMs;
    this.seen.push(seen);
    if (!check.ok) {
      seen.problem = check.problem;
      this.invalid.push(seen);
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end('{"error":"invalid_token"}');
      return;
    }
    this.tokenIds.add(check.tokenId);
    const text = JSON.stringify({ jsonrpc: '2.0', id, result: { tools: [] } });
    if (rpcMethod === 'tools/call') {
      // A tool call answered as an SSE stream: a progress event, then the result.
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write(`event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/progress', params: { progress: 1 } })}\n\n`);
      res.end(`event: message\ndata: ${text}\n\n`);
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

interface Run {
  proc: CliProc;
  code: number | null;
}

async function runCli(args: string[]): Promise<Run> {
  const proc = startCli(args);
  const [code] = (await once(proc.child, 'close')) as [number | null];
  return { proc, code };
}

interface Renewal {
  handoff: string;
  fetchState: string;
  tokenFile: string;
  fetch: CliProc;
  apply: CliProc;
}

/**
 * bind (creates the slot, tokenId null) → `renew apply --watch` and `renew fetch` (loop)
 * against the mock Gateway; resolves once the first token is in the token file.
 */
async function startRenewal(
  tt: TapTest,
  opts: { fwd: ProxyProc; gw: MockRenewGateway; credential: string; bindingId: string; instanceId: string; upstreamUrl: string },
): Promise<Renewal> {
  const { fwd, gw } = opts;
  const root = tempDir('ac-renew-e2e-');
  tt.teardown(() => rmSync(root, { recursive: true, force: true }));
  const handoff = join(root, 'handoff');
  const fetchState = join(root, 'fetch-state');
  const credentialFile = join(root, 'host-credential');
  mkdirSync(fetchState, { recursive: true });
  writeFileSync(credentialFile, `${opts.credential}\n`, { mode: 0o600 });

  const bound = await runCli(['bind', opts.bindingId, '--instance-id', opts.instanceId, '--upstream', opts.upstreamUrl, '--state-dir', fwd.stateDir, '--handoff', handoff]);
  tt.equal(bound.code, 0, `bind: ${bound.proc.lines.join('\n')}`);
  await fwd.waitForLog((l) => l.msg === 'registry loaded' && l.instances === 1);
  const slotFile = join(handoff, 'slots', `instance:${opts.instanceId}.json`);
  tt.match(JSON.parse(readFileSync(slotFile, 'utf8')), { tokenId: null }, 'bind created the slot with tokenId null');

  const apply = startCli(['renew', 'apply', '--watch', '--handoff', handoff, '--state-dir', fwd.stateDir, '--log-level', 'trace']);
  const fetch = startCli([
    'renew', 'fetch', '--gateway', gw.url, '--credential', credentialFile, '--handoff', handoff, '--state-dir', fetchState,
    '--backoff-cap-ms', '200', '--log-level', 'trace',
  ]);
  tt.teardown(async () => {
    await Promise.all([fetch.stop('SIGKILL'), apply.stop('SIGKILL')]);
  });
  const tokenFile = join(fwd.stateDir, 'mcp-forwarder', `${opts.instanceId}.token`);
  // A deadline, not a timing check: two Node starts and a renewal took over 20 s at load 24.
  await until(() => existsSync(tokenFile), 'the first token to be fetched and applied', 60_000);
  tt.equal(statSync(tokenFile).mode & 0o777, 0o600, 'the applied token file is 0600');
  return { handoff, fetchState, tokenFile, fetch, apply };
}

/** Stops fetch and apply the way systemd would, and checks they exit cleanly. */
async function stopRenewal(tt: TapTest, r: Renewal): Promise<void> {
  const [f, a] = await Promise.all([r.fetch.stop('SIGTERM'), r.apply.stop('SIGTERM')]);
  tt.equal(f.code, 0, 'renew fetch exits 0 on SIGTERM');
  tt.equal(a.code, 0, 'renew apply --watch exits 0 on SIGTERM');
  const errors = [...r.fetch.logs, ...r.apply.logs].filter((l) => l.level === 'error' || l.level === 'fatal');
  tt.same(errors.map((l) => l.msg), [], 'neither fetch nor apply logged an error');

  // No secret at rest where none belongs: slot files (read by fetch) and fetch's private state.
  const files: string[] = [];
  const walk = (dir: string): void => {
    if (!existsSync(dir)) return;
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else files.push(p);
    }
  };
  walk(join(r.handoff, 'slots'));
  walk(r.fetchState);
  tt.ok(files.some((f) => f.includes('/slots/')), 'slot files were checked');
  tt.ok(files.some((f) => f.includes('/fetch-state/')), "fetch's state files were checked");
  const leaks = files.flatMap((f) => leakedSecrets(readFileSync(f, 'utf8')).map(() => f.slice(r.handoff.length - 'handoff'.length)));
  tt.same(leaks, [], `no credential or token in any of ${files.length} slot/fetch-state files`);
}

t.test('under load: requests through a running forwarder while tokens rotate every ~400 ms', async (t) => {
  const credential = newCredential();
  const slot = 'instance:inst-load';
  // Renewal is due when a third of the lifetime is left: a token advertised to live 600 ms
  // rotates every ~400 ms, a thousand times more often than a real host. The Gateway is
  // strict: a mint refuses the previous token at once, and the forwarder bridges that by
  // retrying with each token the file newly holds, within one 5 s bound. On a busy 2-core
  // machine (load 24) the mint → rename window reached 1.8 s, longer than the rotation
  // period: the file then held tokens superseded before they were written, and a single
  // retry failed (503 token_rejected); no real lifetime comes near that. Not shorter:
  // a current token must still reach the file within the bound. Expired tokens: the
  // Gateway honours each for 5 s (see advertiseLifetime).
  const gw = await MockRenewGateway.start({ credential, tokenLifetimeMs: 5_000, slots: [slot] });
  t.teardown(() => gw.close());
  const advertised = advertiseLifetime(gw.authority, 600);
  const upstream = await new CheckingUpstream(gw.authority, advertised).start();
  t.teardown(() => upstream.close());
  const fwd = await startProxy(t, 'forwarder');
  const bindingId = 'bind_renew_load_01';
  const renewal = await startRenewal(t, { fwd, gw, credential, bindingId, instanceId: 'inst-load', upstreamUrl: upstream.url() });

  const url = `${fwd.base}/i/${bindingId}/mcp`;
  const agent = new Agent({ connections: 4 });
  t.teardown(() => agent.close());
  const statuses = new Map<number | string, number>();
  const failures: string[] = [];
  let requests = 0;
  let sseAnswers = 0;
  const mintedAtStart = gw.minted(slot);
  const started = Date.now();
  // `npm test` runs ~100 rotations; `npm run bench:rotation` sets RENEW_E2E_ROTATIONS=1000.
  const wantRotations = Number(process.env.RENEW_E2E_ROTATIONS ?? 100);
  const minDuration = 30_000;
  // Rotations are fetch's pace, ~400 ms when idle; at load 32 they averaged ~790 ms (89 in
  // 70 s). A deadline, not a timing check: up to 1 s per rotation.
  const deadline = started + Math.max(60_000, wantRotations * 1_000);
  const rotations = (): number => gw.minted(slot) - mintedAtStart;
  const keepGoing = (): boolean => Date.now() < deadline && (Date.now() - started < minDuration || rotations() < wantRotations);

  const worker = async (w: number): Promise<void> => {
    for (let i = 0; keepGoing(); i++) {
      requests += 1;
      const id = `${w}-${i}`;
      try {
        const res = await request(url, {
          dispatcher: agent,
          method: 'POST',
          headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          // Half the clients call a tool answered over SSE, half list tools answered in JSON.
          body: JSON.stringify(w % 2 === 0 ? { jsonrpc: '2.0', id, method: 'tools/list' } : { jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'x' } }),
        });
        const text = await res.body.text();
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
        if (res.statusCode !== 200) failures.push(`${res.statusCode} ${text.slice(0, 200)}`);
        else if (w % 2 === 0 ? (JSON.parse(text) as { id?: unknown }).id !== id : !sseResultFor(text, id)) failures.push(`wrong answer for ${id}`);
        else if (w % 2 === 1) sseAnswers += 1;
      } catch (err) {
        statuses.set('error', (statuses.get('error') ?? 0) + 1);
        failures.push(`request error: ${(err as Error).message}`);
      }
    }
  };
  await Promise.all([0, 1, 2, 3].map(worker));
  const elapsed = Date.now() - started;
  if (failures.length > 0) {
    // What a failing request met, kept for the post-mortem (the token ids only, never a token).
    const dir = mkdtempSync(join(tmpdir(), 'renew-e2e-failure-'));
    const dump = (name: string, rows: unknown[]): void => writeFileSync(join(dir, name), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    dump('forwarder.jsonl', fwd.logs);
    dump('fetch.jsonl', renewal.fetch.logs);
    dump('apply.jsonl', renewal.apply.logs);
    dump('upstream.jsonl', upstream.seen);
    dump('mints.jsonl', [...mintTimes].map(([tokenId, at]) => ({ tokenId, at })));
    dump('gateway.jsonl', gw.requests);
    t.comment(`failure dump: ${dir} (${readFileSync('/proc/loadavg', 'utf8').trim()})`);
  }

  t.comment(
    `load: ${requests} requests in ${(elapsed / 1000).toFixed(1)} s (concurrency 4), ${rotations()} rotations ` +
      `(${gw.minted(slot)} tokens minted in all), ${upstream.tokenIds.size} distinct tokens seen upstream, ` +
      `${upstream.seen.length} upstream requests, ${upstream.invalid.length} with an invalid token, statuses ${JSON.stringify(Object.fromEntries(statuses))}`,
  );
  const late = upstream.seen.filter((s) => s.lateMs !== undefined).map((s) => s.lateMs as number);
  t.comment(
    `late: ${late.length} upstream requests (${((100 * late.length) / Math.max(1, upstream.seen.length)).toFixed(2)} %) carried a token ` +
      `past its advertised expiry (within the Gateway's grace), at most ${late.reduce((a, b) => Math.max(a, b), 0)} ms past`,
  );
  t.ok(elapsed >= minDuration, 'traffic flowed for at least 30 s');
  t.ok(rotations() >= wantRotations, `at least ${wantRotations} rotations happened (${rotations()})`);
  t.ok(requests >= 1000, `a real load (${requests} requests)`);
  t.ok(sseAnswers >= 100, `SSE tool calls were part of it (${sseAnswers} complete SSE answers)`);
  t.same(failures.slice(0, 10), [], 'no client request failed (first failures shown)');
  t.equal(statuses.get(200), requests, 'every client request answered 200');
  t.same(
    upstream.invalid.filter((s) => s.problem !== 'superseded or expired').slice(0, 10).map((s) => s.problem),
    [],
    'every upstream request carried a complete token the Gateway had minted (first problems shown)',
  );
  t.ok(upstream.tokenIds.size >= 50, `the upstream saw the rotation (${upstream.tokenIds.size} distinct tokens)`);
  t.equal(gw.authority.stats().conflicts, 0, 'no CAS conflict: fetch always knew the applied token');
  // Strict Gateway: a request sent between a mint and apply's rename is refused (401) and
  // the forwarder retries it with the renewed token (again if that one was superseded
  // before it arrived: under load, renewals every ~400 ms outpace the mint → rename
  // window); no other request is sent twice.
  t.equal(upstream.seen.length, requests + upstream.invalid.length, 'one upstream request per client request, plus one retry per refused one');
  // Access lines are written in batches: wait for the last one before counting.
  await until(() => fwd.logs.filter((l) => l.msg === 'access').length >= requests, 'every access line');
  const retriedLines = fwd.logs.filter((l) => l.msg === 'access' && l.retried === true);
  const retried = retriedLines.length;
  const retries = retriedLines.reduce((n, l) => n + Number(l.retries), 0);
  t.equal(retries, upstream.invalid.length, `the forwarder retried exactly the refused requests (${retried} requests, ${retries} retries)`);

  // The rotation window (SPEC §4): from the Gateway minting a token (the old one refused
  // from then on) to apply's rename putting the new one in place; and what it cost the
  // requests that met it.
  const windows = renewal.apply.logs
    .filter((l) => l.msg === 'token applied' && typeof l.tokenId === 'string' && mintTimes.has(l.tokenId))
    .map((l) => Date.parse(String(l.time)) - (mintTimes.get(String(l.tokenId)) ?? 0));
  const access = fwd.logs.filter((l) => l.msg === 'access');
  const durations = (retried: boolean): number[] => access.filter((l) => (l.retried === true) === retried).map((l) => Number(l.durationMs));
  t.comment(
    `rotation window mint → rename over ${windows.length} rotations: p50 ${pct(windows, 50)} ms, p99 ${pct(windows, 99)} ms, max ${pct(windows, 100)} ms; ` +
      `request duration p50/p99: ${pct(durations(false), 50)}/${pct(durations(false), 99)} ms, ` +
      `${durations(true).length} that met a rotation ${pct(durations(true), 50)}/${pct(durations(true), 99)} ms`,
  );
  // Under load fetch can replace inbox/<slot>.json before apply has taken it (only the
  // newest token matters: the one replaced is already refused): apply then skips a
  // rotation. At load 28, 99 of 101 minted tokens were applied; a tenth is apply falling behind.
  t.ok(windows.length >= wantRotations * 0.9, `the window was measured for (nearly) every rotation (${windows.length})`);

  await stopRenewal(t, renewal);
  const appliedIds = renewal.apply.logs.filter((l) => l.msg === 'token applied').map((l) => String(l.tokenId));
  const applied = appliedIds.length;
  const mintOrder = [...mintTimes.keys()];
  const order = appliedIds.map((id) => mintOrder.indexOf(id));
  t.ok(order.every((i, k) => i >= 0 && (k === 0 || i > (order[k - 1] ?? -1))), 'apply applied minted tokens in mint order, never an older one after a newer one');
  t.comment(`apply applied ${applied} tokens; the Gateway saw ${gw.requests.length} renewal requests`);
  t.ok(applied >= wantRotations * 0.9, `apply applied (nearly) every rotation (${applied})`);
});

t.test('an SDK MCP session through the forwarder survives real rotations by fetch + apply', async (t) => {
  const credential = newCredential();
  const slot = 'instance:inst-mcp';
  const gw = await MockRenewGateway.start({ credential, tokenLifetimeMs: 2_000, slots: [slot] });
  t.teardown(() => gw.close());
  const advertised = advertiseLifetime(gw.authority, 600);
  const upstream = await McpUpstream.start({ tools: ['echo'], check: (token) => checkBearer(token, gw.authority, advertised) });
  t.teardown(() => upstream.close());
  const fwd = await startProxy(t, 'forwarder');
  const bindingId = 'bind_renew_mcp_01';
  const renewal = await startRenewal(t, { fwd, gw, credential, bindingId, instanceId: 'inst-mcp', upstreamUrl: upstream.url() });

  const client = new Client({ name: 'renew-e2e-agent', version: '0.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(`${fwd.base}/i/${bindingId}/mcp`));
  t.teardown(() => client.close());
  await client.connect(transport);
  const sessionId = transport.sessionId;
  t.ok(sessionId, 'the upstream issued a session id that reached the client');

  const validTokenIds = (): Set<string> => new Set(upstream.seen.filter((s) => s.valid && s.tokenId).map((s) => s.tokenId as string));
  const deadline = Date.now() + 25_000;
  let calls = 0;
  while (validTokenIds().size < 4 && Date.now() < deadline) {
    const token = readFileSync(renewal.tokenFile, 'utf8');
    const result = await client.callTool({ name: 'echo', arguments: { text: `call ${calls}` } });
    const content = result.content as Array<{ type: string; text?: string }>;
    t.equal(content[0]?.text, `echo: call ${calls}`, `call ${calls} succeeded`);
    calls += 1;
    // Next call once renewal has replaced the token (fetch + apply, no help from the test).
    await until(() => readFileSync(renewal.tokenFile, 'utf8') !== token, 'the next rotation', 15_000);
  }
  const tools = await client.listTools();
  t.same(tools.tools.map((x) => x.name), ['echo'], 'tools/list still works in the same session');
  await transport.terminateSession();
  await until(() => upstream.seen.some((s) => s.method === 'DELETE'), 'the DELETE to reach the upstream');

  // What the upstream accepted (a request refused for a superseded token never reached the
  // MCP server; the forwarder retried it, initialize included, with the renewed token).
  const accepted = upstream.seen.filter((s) => s.valid);
  const [init, ...rest] = accepted;
  t.equal(init?.rpcMethod, 'initialize', 'the first request the upstream accepted was initialize');
  t.same(
    rest.filter((s) => s.sessionId !== sessionId).map((s) => `${s.method} ${s.rpcMethod ?? ''}`),
    [],
    'every later upstream request carried the same mcp-session-id',
  );
  // Strict Gateway: a request that met a rotation is refused (a token it minted and has
  // just superseded) and retried by the forwarder with the renewed token; nothing else.
  const refused = upstream.seen.filter((s) => !s.valid);
  t.same(refused.filter((s) => s.problem !== 'superseded or expired').map((s) => s.problem), [], 'every upstream request carried a token the Gateway minted');
  const retries = (): number => fwd.logs.filter((l) => l.msg === 'access' && l.retried === true).reduce((n, l) => n + Number(l.retries), 0);
  await until(() => retries() >= refused.length, 'the access lines of the retried requests');
  t.equal(retries(), refused.length, `each refused request was retried (${refused.length})`);
  t.ok(validTokenIds().size >= 4, `the upstream saw at least 4 distinct tokens (${validTokenIds().size}): 3 rotations`);
  t.ok(gw.minted(slot) >= 4, `the Gateway minted them (${gw.minted(slot)})`);
  t.equal(accepted.filter((s) => s.rpcMethod === 'initialize').length, 1, 'one session, never re-initialized');
  t.comment(`mcp: ${calls} tool calls, ${validTokenIds().size} tokens seen upstream, ${gw.minted(slot)} minted, ${upstream.seen.length} upstream requests`);
  await stopRenewal(t, renewal);
});

t.test('the leak checks have secrets to look for', async (t) => {
  t.equal([...knownSecrets].filter((s) => s.startsWith('hostcred-')).length, 2, 'both host credentials are known secrets');
  t.ok(knownSecrets.size > 100, `every minted token is a known secret (${knownSecrets.size} secrets)`);
});

checkNoLeaks(t);
