import { mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { checkNoLeaks, knownSecrets, leakedSecrets, writeToken, type CliProc } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { until } from '../test/support/poll.js';
import { startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { waitAuditDrained } from '../bench/lib/audit-drain.js';
import { scrape } from './helpers/scrape.js';

/*
 * The audit queue's gauge (docs/metrics.md), black-box: a real cli-proxy with metrics on,
 * real calls, real spool files. The disk is "held up" by the test hook audit-hold-writes
 * (every write waits until SIGUSR2), so the events of answered calls are queued for as long
 * as the test needs, whatever the machine's speed; then released, they reach the disk and
 * the gauge falls back to 0. This is what the bench polls between cells.
 */

const TOKEN = 'tok-audit-metrics-saas-3f9c0e';
knownSecrets.add(TOKEN);
const QUEUED = 'agent_connectors_audit_queued_events';

async function metricsPort(proc: CliProc): Promise<number> {
  return (await proc.waitForLog((l) => l.msg === 'metrics listening', 20_000)).port as number;
}

async function startAudited(t: TapTest, args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ proxy: ProxyProc; spool: string }> {
  const saas = await MockGateway.start();
  t.teardown(() => saas.close());
  saas.handle((_req, res) => json(res, 200, { ok: true }));
  const stateDir = tempDir('ac-audit-metrics-', t);
  const tokenFile = join(stateDir, 'cli-proxy', 'saas.token');
  mkdirSync(join(stateDir, 'cli-proxy'), { recursive: true, mode: 0o700 });
  writeToken(tokenFile, TOKEN);
  const catalog = { saas: { upstream: saas.url('/api'), tokenFile, inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' } } };
  const proxy = await startProxy(t, 'cli-proxy', { stateDir, config: catalog, args: ['--metrics-listen', '127.0.0.1:0', ...args], env });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  return { proxy, spool: join(stateDir, 'audit') };
}

async function call(proxy: ProxyProc, i: number): Promise<number> {
  const res = await request(`${proxy.base}/p/saas/v1/items/${i}`, { method: 'GET' });
  await res.body.text();
  return res.statusCode;
}

function eventFiles(dir: string): string[] {
  return readdirSync(dir).filter((n) => /^\d{15}-/.test(n));
}

t.test('the queued-events gauge counts answered calls whose events wait for the disk, and is 0 once they are written', async (t) => {
  const { proxy, spool } = await startAudited(t, [], { AGENT_CONNECTORS_TEST_HOOKS: 'audit-hold-writes' });
  const port = await metricsPort(proxy);
  t.equal((await scrape(port)).value(QUEUED), 0, 'nothing queued before the first call');
  t.equal((await scrape(port)).find(QUEUED).length, 1, 'the series is there from the start');

  const N = 6;
  // Every call is answered while its event cannot be written: the audit never delays a call.
  for (let i = 0; i < N; i++) t.equal(await call(proxy, i), 200, `call ${i} answered`);
  // The gauge is read at the scrape; the last event is queued right after its response closes.
  let seen = 0;
  await until(async () => (seen = (await scrape(port)).value(QUEUED)) === N, `${N} events queued (last seen ${seen})`);
  t.equal(seen, N, 'every answered call\'s event is queued');
  t.same(eventFiles(spool), [], 'none written: the writes are held');

  proxy.child.kill('SIGUSR2');
  await proxy.waitForLog((l) => l.msg === 'test hook: audit writes released');
  await until(async () => (seen = (await scrape(port)).value(QUEUED)) === 0, `the queue drained (last seen ${seen})`);
  const written = eventFiles(spool);
  t.equal(written.length, N, 'at 0, every event is on disk');
  const ids = new Set(proxy.logs.filter((l) => l.msg === 'access' && l.provider === 'saas').map((l) => l.reqId));
  t.same(new Set(written.map((n) => (JSON.parse(readFileSync(join(spool, n), 'utf8')) as { id: string }).id)), ids, 'the events of exactly those calls');

  // After the drain it follows new calls too (nothing held any more).
  t.equal(await call(proxy, N), 200);
  await until(() => eventFiles(spool).length === N + 1, 'the next event written');
  t.equal((await scrape(port)).value(QUEUED), 0, 'and it is 0 again once that one is written');
  t.same(leakedSecrets((await scrape(port)).text), [], 'no token in the scrape');
});

t.test('the bench\'s wait between cells: it gives up at its bound while events stay queued, and ends once they are written', async (t) => {
  const { proxy, spool } = await startAudited(t, [], { AGENT_CONNECTORS_TEST_HOOKS: 'audit-hold-writes' });
  const port = await metricsPort(proxy);
  const pid = proxy.child.pid as number;
  for (let i = 0; i < 3; i++) t.equal(await call(proxy, i), 200);
  await until(async () => (await scrape(port)).value(QUEUED) === 3, '3 events queued');
  const held = await waitAuditDrained(port, [pid], 300);
  t.match(held, { queued: 3, drained: false, left: 3 }, 'not drained: the bench warns and goes on');
  proxy.child.kill('SIGUSR2');
  const done = await waitAuditDrained(port, [pid], 30_000);
  // Its first scrape may come before or after the release took effect: only the end is certain.
  t.match(done, { drained: true, left: 0 }, 'drained once the writes are released');
  t.equal(eventFiles(spool).length, 3, 'and the events are on disk by then');
});

t.test('without the audit the cli-proxy serves no queue gauge', async (t) => {
  const { proxy } = await startAudited(t, ['--no-audit']);
  const port = await metricsPort(proxy);
  t.equal(await call(proxy, 1), 200);
  t.same((await scrape(port)).find(QUEUED), [], 'no series: there is no queue');
  t.equal(await waitAuditDrained(port, [proxy.child.pid as number]), undefined, 'the bench has nothing to wait for');
});

checkNoLeaks(t);
