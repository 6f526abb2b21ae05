import { EventEmitter, once } from 'node:events';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { emptySlotFile, handoffPaths, slotFileName } from '../../src/data/handoff.js';
import { createLinkServices } from '../../src/link/link.js';
import { defaultPresenceConfig } from '../../src/link/presence.js';
import { defaultRenewalConfig } from '../../src/link/renewal/renewal-service.js';
import { createNotifier } from '../../src/service/sd-notify.js';
import { runServices } from '../../src/service/service.js';
import { memoryLogger } from '../support/memory-log.js';
import { until } from '../support/poll.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

/**
 * The link's one stop switch (issue 19): renewal, the state poll and presence share one host
 * credential, so a 401 to any of them halts all of them, a request in flight included, until
 * the credential file changes; then all of them resume.
 */

const OLD = 'hostcred-old-5b0d1c';
const NEW = 'hostcred-new-93fa2e';
type Endpoint = 'state' | 'presence' | 'renew';

/**
 * A Gateway that refuses OLD on one endpoint (401) and holds every other request unanswered,
 * so each part of the link has one request in flight when the 401 comes, and the test sees
 * each of them cut.
 */
async function gateway(t: TapTest, refuses: Endpoint) {
  const seen: Array<{ endpoint: Endpoint; credential: string }> = [];
  const held = new Map<ServerResponse, Endpoint>();
  const heldAll = (): boolean => (['state', 'presence', 'renew'] as const).filter((e) => e !== refuses).every((e) => [...held.values()].includes(e));
  const refusals: Array<() => void> = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const credential = (req.headers.authorization ?? '').replace(/^Bearer /, '');
    const path = req.url ?? '';
    const endpoint: Endpoint = path.startsWith('/v1/host/state') ? 'state' : path.startsWith('/v1/host/presence') ? 'presence' : 'renew';
    seen.push({ endpoint, credential });
    req.resume();
    if (credential === OLD && endpoint === refuses) {
      const refuse = (): void => void res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"host_credential_invalid"}');
      if (heldAll()) refuse();
      else refusals.push(refuse);
      return;
    }
    held.set(res, endpoint);
    res.on('close', () => held.delete(res));
    if (heldAll()) for (const refuse of refusals.splice(0)) refuse();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(async () => {
    for (const res of held.keys()) res.destroy();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const count = (endpoint: Endpoint, credential: string): number => seen.filter((s) => s.endpoint === endpoint && s.credential === credential).length;
  return { url, seen, held, count };
}

async function startLink(t: TapTest, gatewayUrl: string) {
  const root = tempDir('ac-link-', t);
  const credentialPath = join(root, 'host-credential');
  writeFileSync(credentialPath, `${OLD}\n`, { mode: 0o600 });
  const paths = handoffPaths(join(root, 'handoff'));
  for (const dir of [paths.slots, paths.inbox]) mkdirSync(dir, { recursive: true });
  writeFileSync(join(paths.slots, slotFileName('instance:one')), JSON.stringify(emptySlotFile('instance:one')));
  const { log, lines } = memoryLogger();
  const services = createLinkServices(
    {
      gatewayUrl,
      credentialPath,
      renewal: { ...defaultRenewalConfig, handoffDir: paths.root, privateDir: join(root, 'link'), backoff: { baseMs: 20, capMs: 50 }, maxSleepMs: 200 },
      enrolled: {
        poller: { handoffDir: paths.root, pollTimeoutMs: 30_000, backoff: { baseMs: 20, capMs: 50 }, credentialRecheckMs: 50 },
        presence: { ...defaultPresenceConfig, handoffDir: paths.root, hostId: 'host-1', version: '0.0.0', health: {}, intervalMs: 100, minGapMs: 50 },
      },
    },
    log,
  );
  const signals = new EventEmitter();
  const running = runServices(services, { log, notifier: createNotifier({ env: {} }), signals, forceExitAfterMs: false });
  t.teardown(async () => {
    signals.emit('SIGTERM', 'SIGTERM');
    await running;
  });
  return { credentialPath, lines, signals };
}

/** A halted link sends nothing: nothing can prove a negative at once, so this is a window. */
const HALTED_WINDOW_MS = 600;

async function haltsAllThenResumes(t: TapTest, refuses: Endpoint): Promise<void> {
  const gw = await gateway(t, refuses);
  const link = await startLink(t, gw.url);
  await until(() => link.lines.some((l) => l.includes('host credential rejected by the Gateway (401)')), `a 401 to ${refuses} halts the link`);
  await until(() => gw.held.size === 0, 'every request in flight is cut');
  const before = gw.seen.length;
  await new Promise((r) => setTimeout(r, HALTED_WINDOW_MS));
  t.same(gw.seen.slice(before), [], 'nothing sent while halted: no renewal, no poll, no presence');

  writeFileSync(link.credentialPath, `${NEW}\n`, { mode: 0o600 });
  await until(() => gw.count('state', NEW) >= 1, 'the state poll resumes with the new credential');
  await until(() => gw.count('presence', NEW) >= 1, 'presence resumes');
  await until(() => gw.count('renew', NEW) >= 1, 'renewals resume');
  t.ok(link.lines.some((l) => l.includes('host credential changed; the link resumes')), 'the resume is logged once for the link');
  t.notOk(link.lines.some((l) => l.includes(OLD) || l.includes(NEW)), 'never a credential in the log');
}

t.test('a 401 to a renewal stops the state poll and presence; a changed credential resumes all', (t) => haltsAllThenResumes(t, 'renew'));
t.test('a 401 to the state poll stops renewals and presence; a changed credential resumes all', (t) => haltsAllThenResumes(t, 'state'));
t.test('a 401 to presence stops renewals and the state poll; a changed credential resumes all', (t) => haltsAllThenResumes(t, 'presence'));
