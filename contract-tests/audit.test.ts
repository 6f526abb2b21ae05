import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, knownSecrets, leakedSecrets, startCli, writeToken, type CliProc } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { until } from '../test/support/poll.js';
import { startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';

/*
 * native_cli audit (SPEC §9), black-box: a cli-proxy spools one event per call, the link
 * uploads them to a MockHostGateway, idempotent by event id, deleting only what was
 * accepted. The run goes through a Gateway outage (its port refusing connections), a 5xx
 * and 429 storm, a link SIGKILLed while the Gateway holds a batch it has stored, and a
 * cli-proxy SIGKILLed half-way through writing an event; at the end every call whose event
 * was written is stored once at the Gateway. Expected ids come from the cli-proxy's access
 * lines (reqId is the event id). Every wait is on a log line or the mock's records.
 */

const HOST = 'host-audit-1';
const TOKEN = 'tok-audit-saas-secret-8d2f1a';
const QUERY_SECRET = 'qs-secret-never-audited-51c0';
const HEADER_SECRET = 'hdr-secret-never-audited-7e3b';
const BODY_SECRET = 'body-secret-never-audited-94aa';
for (const s of [TOKEN, QUERY_SECRET, HEADER_SECRET, BODY_SECRET]) knownSecrets.add(s);

/** A TCP relay in front of the mock Gateway that can refuse connections (an outage) and come back on the same port. */
class Relay {
  port = 0;
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  constructor(private readonly target: number) {}

  async up(): Promise<void> {
    const server = createServer((client) => {
      const upstream = connect(this.target, '127.0.0.1');
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on('close', () => this.sockets.delete(s));
        s.on('error', () => undefined);
      }
      client.pipe(upstream).pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    server.listen(this.port, '127.0.0.1');
    await once(server, 'listening');
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  async down(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise<void>((r) => server.close(() => r()));
  }
}

interface Rig {
  saas: MockGateway;
  gw: MockHostGateway;
  relay: Relay;
  stateDir: string;
  spool: string;
  credentialPath: string;
  procs: { proxy: ProxyProc; link: CliProc | undefined };
}

async function startRig(t: TapTest, proxyArgs: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<Rig> {
  const saas = await MockGateway.start();
  t.teardown(() => saas.close());
  saas.handle((req, res) => json(res, 200, { ok: true, seen: req.url.length }));
  const credential = `hostcred-audit-${randomUUID()}`;
  knownSecrets.add(credential);
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { [HOST]: credential } });
  t.teardown(() => gw.close());
  const relay = new Relay(gw.port);
  await relay.up();
  t.teardown(() => relay.down());
  const stateDir = tempDir('ac-audit-', t);
  const cliDir = join(stateDir, 'cli-proxy');
  mkdirSync(cliDir, { recursive: true, mode: 0o700 });
  writeToken(join(cliDir, 'saas.token'), TOKEN);
  const catalog = { saas: { upstream: saas.url('/api'), tokenFile: join(cliDir, 'saas.token'), inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } } };
  const proxy = await startProxy(t, 'cli-proxy', { stateDir, config: catalog, args: proxyArgs, env });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  const credentialPath = join(stateDir, 'host-credential');
  writeToken(credentialPath, credential);
  mkdirSync(join(stateDir, 'handoff', 'slots'), { recursive: true });
  mkdirSync(join(stateDir, 'handoff', 'inbox'), { recursive: true });
  return { saas, gw, relay, stateDir, spool: join(stateDir, 'audit'), credentialPath, procs: { proxy, link: undefined } };
}

function startLink(t: TapTest, rig: Rig): CliProc {
  const link = startCli([
    'link',
    '--gateway', `http://127.0.0.1:${rig.relay.port}`,
    '--credential', rig.credentialPath,
    '--state-dir', rig.stateDir,
    '--host-id', HOST,
    '--link-backoff-base-ms', '50',
    '--link-backoff-cap-ms', '400',
    '--audit-min-gap-ms', '50',
    '--poll-timeout-ms', '1500',
    '--credential-recheck-ms', '200',
    '--forwarder-health', 'http://127.0.0.1:9/healthz',
    '--cli-proxy-health', 'http://127.0.0.1:9/healthz',
    '--log-level', 'trace',
  ]);
  t.teardown(() => link.stop('SIGKILL'));
  rig.procs.link = link;
  return link;
}

/** One CLI call through the proxy, carrying a secret in its query, a header and its body. */
async function cliCall(proxy: ProxyProc, i: number): Promise<void> {
  const res = await request(`${proxy.base}/p/saas/v1/items/${i}?filter=${QUERY_SECRET}&n=${i}`, {
    method: i % 2 === 0 ? 'GET' : 'POST',
    headers: { 'x-custom': HEADER_SECRET, 'content-type': 'application/json' },
    ...(i % 2 === 0 ? {} : { body: JSON.stringify({ note: BODY_SECRET }) }),
  });
  await res.body.text();
  if (res.statusCode !== 200) throw new Error(`call ${i}: status ${res.statusCode}`);
}

/** Event ids the proxy gave its calls to the provider (an access line's reqId is its event id). */
function auditedIds(proxy: ProxyProc): string[] {
  return proxy.logs.filter((l) => l.msg === 'access' && l.provider === 'saas').map((l) => l.reqId as string);
}

function spoolFiles(dir: string): string[] {
  // Events only: not temps, dropped.json, upload.json or spool.json.
  return readdirSync(dir).filter((n) => /^\d{15}-/.test(n));
}

/** Calls `n` times and waits until the proxy logged each call (its event is queued by then). */
async function calls(proxy: ProxyProc, from: number, n: number): Promise<void> {
  const before = auditedIds(proxy).length;
  for (let i = from; i < from + n; i++) await cliCall(proxy, i);
  await until(() => auditedIds(proxy).length >= before + n, `${n} access lines`);
}

function storedIds(gw: MockHostGateway): string[] {
  return gw.control.auditEvents.map((r) => r.event.id);
}

async function allStored(gw: MockHostGateway, ids: readonly string[], what: string, timeoutMs = 30_000): Promise<void> {
  await until(() => {
    const stored = new Set(storedIds(gw));
    return ids.every((id) => stored.has(id));
  }, what, timeoutMs);
}

t.test('every event arrives exactly once across an outage, a 5xx storm and SIGKILLs of the link and the cli-proxy', async (t) => {
  t.setTimeout(180_000);
  const rig = await startRig(t);
  const { gw, relay } = rig;
  let link = startLink(t, rig);
  const expected: string[] = [];
  const faults: Record<string, number> = {};
  let n = 0;
  const phase = async (count: number): Promise<string[]> => {
    const before = auditedIds(rig.procs.proxy).length;
    await calls(rig.procs.proxy, n, count);
    n += count;
    const ids = auditedIds(rig.procs.proxy).slice(before);
    expected.push(...ids);
    return ids;
  };

  // Plain run.
  await allStored(gw, await phase(5), 'first 5 events stored');
  await until(() => spoolFiles(rig.spool).length === 0, 'accepted events are deleted from the spool');
  // status tells the operator the spool reaches the Gateway (the link records each accepted batch).
  const statusProc = startCli(['status', '--json', '--no-systemd', '--state-dir', rig.stateDir]);
  t.equal((await statusProc.exited).code, 0, 'status exits 0');
  const status = JSON.parse(statusProc.lines.filter((l) => !l.startsWith('{"level"')).join('\n')) as { lastAuditUpload?: string; audit?: { spooled: number; dropped: number } };
  t.ok(status.lastAuditUpload && Date.parse(status.lastAuditUpload) > 0, `status names the last audit upload (${status.lastAuditUpload})`);
  t.same(status.audit, { spooled: 0, dropped: 0 }, 'status: nothing left in the spool, nothing dropped');

  // Outage: the Gateway's port refuses connections while calls go on.
  await relay.down();
  faults.outage = 1;
  const mark = link.logs.length;
  const outageIds = await phase(10);
  await link.waitForLog((l) => l.msg === 'audit upload failed; events stay spooled; retrying', 15_000, mark);
  await until(() => spoolFiles(rig.spool).length === 10, 'during the outage the 10 events wait in the spool');
  for (const name of spoolFiles(rig.spool)) t.equal(statSync(join(rig.spool, name)).mode & 0o777, 0o640, `${name} is 0640`);
  await relay.up();
  await allStored(gw, outageIds, 'outage events stored after the Gateway came back');

  // 5xx and 429 storm.
  for (const status of [500, 502, 503, 504, 503, 500]) gw.inject({ kind: 'status5xx', status }, { endpoint: 'audit' });
  gw.inject({ kind: 'status429', retryAfterS: 1 }, { endpoint: 'audit', times: 2 });
  gw.inject({ kind: 'dropAfterCommit' }, { endpoint: 'audit', times: 2 });
  faults['5xx'] = 6;
  faults['429'] = 2;
  faults.lostAnswer = 2;
  const storm = await phase(10);
  // A lost answer stores the batch: wait for the faults to be used up, then for the events.
  await until(() => gw.pendingFaults() === 0, 'every storm fault met', 30_000);
  await allStored(gw, storm, 'storm events stored');

  // The link killed while the Gateway holds a batch it has already stored.
  gw.inject({ kind: 'commitThenHang' }, { endpoint: 'audit' });
  const held = await phase(5);
  await until(() => gw.requestsTo('audit').some((r) => r.fault === 'commitThenHang'), 'the Gateway holds a batch');
  await link.stop('SIGKILL');
  faults.linkSigkill = 1;
  t.ok(spoolFiles(rig.spool).length >= 1, 'the held batch is still spooled (not accepted yet)');
  link = startLink(t, rig);
  await allStored(gw, held, 'held events stored');
  // The held batch is stored already, so this waits for a whole restart of the link (a
  // process start, then its first upload): 10 s was too short on a loaded 2-core VM.
  await until(() => spoolFiles(rig.spool).length === 0, 'the restarted link resent and deleted them', 60_000);
  t.ok(gw.control.stats().auditRepeats >= 1, 'the restarted link resent what the Gateway had stored (and the Gateway stored it once)');

  // The cli-proxy killed half-way through writing an event.
  const old = rig.procs.proxy;
  await old.stop('SIGTERM');
  const paused = await startProxy(t, 'cli-proxy', { stateDir: rig.stateDir, env: { AGENT_CONNECTORS_TEST_HOOKS: 'audit-pause-mid-write' } });
  await paused.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  await cliCall(paused, n++);
  await paused.waitForLog((l) => l.msg === 'test hook: audit write paused mid-file');
  await paused.stop('SIGKILL');
  faults.cliProxySigkill = 1;
  const temps = readdirSync(rig.spool).filter((f) => f.startsWith('.'));
  t.equal(temps.length, 1, 'a half-written temp file is left');
  const half = readFileSync(join(rig.spool, temps[0] as string), 'utf8');
  t.throws(() => JSON.parse(half), 'it holds half an event');
  rig.procs.proxy = await startProxy(t, 'cli-proxy', { stateDir: rig.stateDir });
  await rig.procs.proxy.waitForLog((l) => l.msg === 'audit spool: removed partial writes of a killed process');
  t.same(readdirSync(rig.spool).filter((f) => f.startsWith('.')), [], 'the restarted cli-proxy removed the partial write');
  await allStored(gw, await phase(5), 'events after the cli-proxy restart stored');

  // The figures.
  const stored = storedIds(gw);
  const lostInFlight = auditedIds(paused);
  const storedSet = new Set(stored);
  t.equal(stored.length, storedSet.size, 'no event stored twice');
  t.same([...storedSet].sort(), [...expected].sort(), 'exactly the written events are stored: none lost, none extra');
  t.notOk(lostInFlight.some((id) => storedSet.has(id)), 'the half-written event never reached the Gateway');
  for (const r of gw.control.auditEvents) {
    t.equal(r.event.provider, 'saas');
    t.notOk(r.event.path.includes('?'), 'no query string in the path');
    t.match(r.event.path, /^\/v1\/items\/\d+$/);
    t.equal(r.event.status, 200);
    t.equal(r.event.peerUid, process.getuid?.(), 'the caller is named by UID');
  }
  const bodies = JSON.stringify(gw.auditBodies);
  t.same(leakedSecrets(bodies), [], 'no token, query, header value or body in any upload');
  t.notOk(/filter=|x-custom|BODY|note/i.test(bodies), 'not even the names around them');
  const figures = {
    events: expected.length,
    stored: stored.length,
    uploads: gw.requestsTo('audit').length,
    resentIds: gw.control.stats().auditRepeats,
    duplicatesStored: stored.length - storedSet.size,
    lost: expected.filter((id) => !storedSet.has(id)).length,
    inFlightAtCliProxyKill: lostInFlight.length,
    faults,
  };
  t.comment(`audit figures: ${JSON.stringify(figures)}`);
});

t.test('a full spool drops the oldest events and the upload reports how many', async (t) => {
  t.setTimeout(60_000);
  const rig = await startRig(t, ['--audit-max-events', '5']);
  await calls(rig.procs.proxy, 0, 8);
  const ids = auditedIds(rig.procs.proxy);
  await until(() => readdirSync(rig.spool).includes('dropped.json') && JSON.parse(readFileSync(join(rig.spool, 'dropped.json'), 'utf8')).dropped === 3, 'dropped count 3');
  const spooled = (): string[] => spoolFiles(rig.spool).map((f) => (JSON.parse(readFileSync(join(rig.spool, f), 'utf8')) as { id: string }).id);
  await until(() => JSON.stringify(spooled().sort()) === JSON.stringify(ids.slice(3).sort()), 'the newest five are kept, the oldest three gone');
  t.equal(spoolFiles(rig.spool).length, 5, 'five events spooled');
  const all = readdirSync(rig.spool).map((f) => readFileSync(join(rig.spool, f), 'utf8')).join('\n');
  t.same(leakedSecrets(all), [], 'nothing secret in the spool');
  await rig.procs.proxy.waitForLog((l) => l.msg === 'audit spool full: oldest events dropped');

  startLink(t, rig);
  await allStored(rig.gw, ids.slice(3), 'the five kept events stored');
  t.equal(rig.gw.control.auditDropped.get(HOST), 3, 'the Gateway learned that 3 were dropped');
  t.same(storedIds(rig.gw).filter((id) => ids.slice(0, 3).includes(id)), [], 'the dropped ones never arrive');
});

checkNoLeaks(t);
