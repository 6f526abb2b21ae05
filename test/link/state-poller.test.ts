import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { hostCredential } from '../support/host-credential.js';
import { createStatePoller, handedOverVersion } from '../../src/link/state-poller.js';
import { createNotifier } from '../../src/service/sd-notify.js';
import { runServices } from '../../src/service/service.js';
import { EventEmitter } from 'node:events';
import { memoryLogger } from '../support/memory-log.js';
import { MockHostGateway } from '../support/mock-host-gateway.js';
import { until } from '../support/poll.js';
import { tempDir } from '../support/temp-dir.js';

const CRED = 'hostcred-unit-test-7c1e9a';

t.test('handedOverVersion: the file version, 0 when missing or unusable', async (t) => {
  const dir = tempDir('ac-poller-', t);
  const file = join(dir, 'desired-state.json');
  t.equal(await handedOverVersion(file), 0);
  writeFileSync(file, '{"version": 7, "bindings": {}, "providers": {}}');
  t.equal(await handedOverVersion(file), 7);
  writeFileSync(file, '{"version": "x"}');
  t.equal(await handedOverVersion(file), 0);
});

t.test('HostCredential: a 401 halts until the credential changes; unusable when missing', async (t) => {
  const dir = tempDir('ac-poller-', t);
  const path = join(dir, 'cred');
  const { log, lines } = memoryLogger();
  const c = hostCredential(t, path, 'http://127.0.0.1:9', log);
  t.equal(c.read().kind, 'unusable');
  writeFileSync(path, `${CRED}\n`);
  const first = c.read();
  t.same(first, { kind: 'ok', credential: CRED });
  let changes = 0;
  c.onChange(() => (changes += 1));
  c.halt(CRED);
  t.ok(c.halted);
  t.equal(c.read().kind, 'halted');
  writeFileSync(path, `${CRED}-new\n`);
  t.same(c.read(), { kind: 'ok', credential: `${CRED}-new` });
  t.notOk(c.halted);
  t.equal(changes, 2, 'halt and resume announced');
  t.ok(lines.some((l) => l.includes('re-enrol')));
  t.notOk(lines.some((l) => l.includes(CRED)), 'never the credential in a log line');
});

t.test('the poller starts from the handed-over version and hands over newer ones (0640)', async (t) => {
  const gw = await MockHostGateway.start({ longPollMs: 200, staticHosts: { h1: CRED } });
  t.teardown(() => gw.close());
  const dir = tempDir('ac-poller-', t);
  const credPath = join(dir, 'cred');
  writeFileSync(credPath, `${CRED}\n`);
  gw.control.connectBinding('bind_unit_0001', { instanceId: 'inst-1', upstreamUrl: 'https://gw.example.com/mcp' });
  // Already handed over: version 2 (the Gateway's current).
  const file = join(dir, 'desired-state.json');
  writeFileSync(file, JSON.stringify(gw.control.state()));
  const { log, lines } = memoryLogger();
  const handed: number[] = [];
  const poller = createStatePoller(
    { handoffDir: dir, pollTimeoutMs: 2_000, backoff: { baseMs: 20, capMs: 100 }, credentialRecheckMs: 100, onHandedOver: (v) => handed.push(v) },
    hostCredential(t, credPath, gw.url, log),
  );
  const signals = new EventEmitter();
  const running = runServices([poller], { log, notifier: createNotifier({ env: {} }), signals, forceExitAfterMs: false });
  await gw.waitForRequests(1);
  t.equal(gw.requests[0]?.after, 2, 'first poll after=2');
  gw.control.connectBinding('bind_unit_0002', { instanceId: 'inst-2', upstreamUrl: 'https://gw.example.com/mcp/2' });
  await until(() => handed.includes(3), 'version 3 handed over');
  t.equal(readFileSync(file, 'utf8'), JSON.stringify(gw.control.state()));
  t.equal(statSync(file).mode & 0o777, 0o640);
  signals.emit('SIGTERM', 'SIGTERM');
  await running;
  t.notOk(lines.some((l) => l.includes(CRED)));
});
