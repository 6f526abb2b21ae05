import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { checkNoLeaks, knownSecrets, startCli, writeToken, type CliProc } from '../test/support/cli-proc.js';
import { craftedStates, MockHostGateway, type HostFault, type HostRequestRecord } from '../test/support/mock-host-gateway.js';
import { until } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';

/*
 * `agent-connectors link`, black-box with the built CLI against a MockHostGateway (SPEC
 * §8): the desired state lands in <handoff>/desired-state.json (exact, 0640) and follows
 * new versions; every fault leaves the file untouched and the link recovers; 401 stops the
 * poll and presence until the credential changes; presence carries the applied version and
 * slots within 5 s of a change, and never a token or the credential. Everything waits on
 * the mock's request records or log lines; the one fixed wait is the window in which a
 * halted link must send nothing.
 */

const HOST = 'host-link-1';
const TOKEN_ID = 'tok_0123456789abcdef';
const A_TOKEN = 'tok-secret-never-in-presence-4f1d2c';

interface Rig {
  gw: MockHostGateway;
  proc: CliProc;
  handoff: string;
  file: string;
  credentialPath: string;
}

async function healthyPart(t: TapTest): Promise<string> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ status: 'ok' }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/healthz`;
}

async function startLink(t: TapTest, name: string): Promise<Rig> {
  const credential = `hostcred-${name}-${randomUUID()}`;
  knownSecrets.add(credential);
  const gw = await MockHostGateway.start({ longPollMs: 300, staticHosts: { [HOST]: credential } });
  t.teardown(() => gw.close());
  const dir = tempDir('ac-link-', t);
  const handoff = join(dir, 'handoff');
  mkdirSync(join(handoff, 'slots'), { recursive: true });
  mkdirSync(join(handoff, 'inbox'), { recursive: true });
  const credentialPath = join(dir, 'host-credential');
  writeToken(credentialPath, credential);
  const cliProxyHealth = await healthyPart(t);
  const proc = startCli([
    'link',
    '--gateway', gw.url,
    '--credential', credentialPath,
    '--handoff', handoff,
    '--state-dir', join(dir, 'state'),
    '--host-id', HOST,
    '--link-backoff-base-ms', '50',
    '--link-backoff-cap-ms', '200',
    '--poll-timeout-ms', '1500',
    '--credential-recheck-ms', '200',
    '--forwarder-health', 'http://127.0.0.1:9/healthz',
    '--cli-proxy-health', cliProxyHealth,
    '--log-level', 'debug',
  ]);
  t.teardown(() => proc.stop());
  return { gw, proc, handoff, file: join(handoff, 'desired-state.json'), credentialPath };
}

function fileVersion(file: string): number | undefined {
  try {
    return (JSON.parse(readFileSync(file, 'utf8')) as { version: number }).version;
  } catch {
    return undefined;
  }
}

function binding(i: number) {
  return { instanceId: `inst-${i}`, upstreamUrl: `https://gw.example.com/mcp/${i}` };
}

t.test('hands the state to desired-state.json (exact, 0640) and follows a second version', async (t) => {
  const { gw, file } = await startLink(t, 'handover');
  await until(() => fileVersion(file) === 1, 'version 1 handed over');
  t.same(JSON.parse(readFileSync(file, 'utf8')), gw.control.state(), 'exactly the Gateway state');
  t.equal(statSync(file).mode & 0o777, 0o640, 'mode 0640');
  gw.control.connectBinding('bind_link_0001', binding(1));
  await until(() => fileVersion(file) === 2, 'version 2 handed over');
  t.equal(readFileSync(file, 'utf8'), JSON.stringify(gw.control.state()), 'the Gateway body, byte for byte');
  t.equal(statSync(file).mode & 0o777, 0o640);
  const polls = gw.requestsTo('state');
  t.ok(polls.every((r) => r.authorization), 'every poll carries the credential');
  await until(() => gw.requestsTo('state').some((r) => r.after === 2), 'polls after=2');
});

const faults: Array<{ name: string; fault: (v: number) => HostFault }> = [
  { name: '503', fault: () => ({ kind: 'status5xx', status: 503 }) },
  { name: 'dropped poll', fault: () => ({ kind: 'dropAfterCommit' }) },
  { name: 'dropped before commit', fault: () => ({ kind: 'dropBeforeCommit' }) },
  { name: 'hang', fault: () => ({ kind: 'hang' }) },
  { name: 'non-JSON', fault: () => ({ kind: 'notJson' }) },
  { name: 'schema failure', fault: () => ({ kind: 'badSchema' }) },
  { name: 'http:// upstream', fault: (v) => ({ kind: 'body', body: craftedStates.httpUpstream(v + 1) }) },
  { name: 'http:// provider upstream', fault: (v) => ({ kind: 'body', body: craftedStates.httpProviderUpstream(v + 1) }) },
];

t.test('each fault leaves the file untouched and the link recovers', async (t) => {
  const { gw, file, proc } = await startLink(t, 'faults');
  await until(() => fileVersion(file) === 1, 'version 1 handed over');
  let n = 10;
  for (const { name, fault } of faults) {
    const before = readFileSync(file, 'utf8');
    const v = gw.control.version;
    const mark = gw.requests.length;
    gw.inject(fault(v), { endpoint: 'state' });
    let faulted: HostRequestRecord | undefined;
    await until(() => (faulted = gw.requests.slice(mark).find((r) => r.endpoint === 'state' && r.fault !== undefined)) !== undefined, `${name} fired`);
    // Recovered: a later poll that the Gateway answered normally.
    await until(
      () => gw.requests.some((r) => r.endpoint === 'state' && r.seq > (faulted as HostRequestRecord).seq && r.fault === undefined && (r.outcome === 204 || r.outcome === 'pending')),
      `a normal poll after ${name}`,
      15_000,
    );
    const crafted = fault(v);
    if (crafted.kind === 'body') {
      // Versioned but invalid: final for its version (SPEC §8), handed to apply, which rejects it.
      t.ok(proc.logs.some((l) => l.msg === 'desired state handed over to apply' && l.version === v + 1), `${name}: handed to apply, the poll moved past it`);
    } else t.equal(readFileSync(file, 'utf8'), before, `${name}: file untouched`);
    gw.control.connectBinding(`bind_link_${String(n).padStart(4, '0')}`, binding(n));
    n += 1;
    await until(() => fileVersion(file) === gw.control.version, `${name}: the next version handed over`);
    t.pass(`${name}: recovered`);
  }
  const warned = proc.logs.filter((l) => l.msg?.includes('state poll failed'));
  t.ok(warned.length >= faults.filter((f) => f.fault(0).kind !== 'body').length, 'each fault logged');
  t.notOk(proc.lines.some((l) => l.includes('502 Bad Gateway') || l.includes('gw.example.com')), 'no body in any log line');
});

t.test('429: the retry does not come before Retry-After', async (t) => {
  const { gw, file } = await startLink(t, 'ratelimit');
  await until(() => fileVersion(file) === 1, 'version 1 handed over');
  const mark = gw.requests.length;
  gw.inject({ kind: 'status429', retryAfterS: 1 }, { endpoint: 'state' });
  let limited: HostRequestRecord | undefined;
  await until(() => (limited = gw.requests.slice(mark).find((r) => r.fault === 'status429')) !== undefined, '429 fired');
  const l = limited as HostRequestRecord;
  await until(() => gw.requests.slice(l.seq).some((r) => r.endpoint === 'state'), 'the retry');
  const retry = gw.requests.slice(l.seq).find((r) => r.endpoint === 'state') as HostRequestRecord;
  t.ok(retry.at - l.at >= 1000, `retry ${retry.at - l.at} ms after the 429 (Retry-After: 1)`);
});

t.test('presence: applied version and slots within 5 s of a change; no token, no credential', async (t) => {
  const { gw, handoff, file, credentialPath } = await startLink(t, 'presence');
  await until(() => fileVersion(file) === 1, 'version 1 handed over');
  await until(() => gw.control.presences.length > 0, 'a first presence');
  const first = gw.control.presences[0]?.body;
  t.equal(first?.hostId, HOST);
  t.equal(first?.parts.forwarder, 'down', 'nothing on the forwarder port');
  t.equal(first?.parts['cli-proxy'], 'ok');
  t.ok(first?.problems.includes('forwarder_down'));
  writeToken(join(handoff, 'not-a-token-file-but-a-secret'), A_TOKEN);
  const changedAt = Date.now();
  writeFileSync(join(handoff, 'slots', 'instance:inst-1.json'), JSON.stringify({ slot: 'instance:inst-1', tokenId: TOKEN_ID, expiresAt: '2030-01-01T00:00:00Z', generation: 1 }));
  writeFileSync(join(handoff, 'applied-state.json'), JSON.stringify({ version: 1, appliedAt: new Date().toISOString() }));
  await until(() => gw.control.presences.some((p) => p.body.stateVersion === 1 && p.body.slots.length === 1), 'presence with the change within 5 s', 5_000);
  const got = gw.control.presences.find((p) => p.body.stateVersion === 1 && p.body.slots.length === 1);
  t.ok((got?.at ?? Infinity) - changedAt <= 5_000, 'within 5 s of the change');
  t.same(got?.body.slots, [{ slot: 'instance:inst-1', tokenId: TOKEN_ID, expiresAt: '2030-01-01T00:00:00Z' }]);
  const all = JSON.stringify(gw.control.presences);
  t.notOk(all.includes(readFileSync(credentialPath, 'utf8').trim()), 'no credential in presence');
  t.notOk(all.includes(A_TOKEN), 'no token in presence');
  // A rejected newer state is reported.
  writeFileSync(join(handoff, 'applied-state.json'), JSON.stringify({ version: 1, appliedAt: new Date().toISOString(), rejected: { version: 2, error: 'x', at: new Date().toISOString() } }));
  await until(() => gw.control.presences.some((p) => p.body.problems.includes('state_rejected')), 'state_rejected reported', 5_000);
  t.pass('state_rejected reported');
});

t.test('401 stops polling and presence, says to re-enrol, resumes on a new credential', async (t) => {
  const { gw, proc, file, handoff, credentialPath } = await startLink(t, 'revoked');
  await until(() => fileVersion(file) === 1, 'version 1 handed over');
  await until(() => gw.control.presences.length > 0, 'a first presence');
  gw.control.revokeHost(HOST);
  await proc.waitForLog((l) => l.msg?.includes('re-enrol') === true && l.level !== undefined, 10_000);
  const mark = gw.requests.length;
  writeFileSync(join(handoff, 'applied-state.json'), JSON.stringify({ version: 1, appliedAt: new Date().toISOString() }));
  // The one fixed wait: a window in which a halted link must send nothing.
  await new Promise((r) => setTimeout(r, 1_500));
  t.same(gw.requests.slice(mark).filter((r) => r.endpoint === 'state' || r.endpoint === 'presence'), [], 'no poll, no presence while halted');
  const answer = gw.control.enroll({ requestId: randomUUID(), code: gw.control.issuePairingCode(), host: { hostname: 'h', version: '0' } });
  const credential = (answer.body as { credential: string }).credential;
  writeToken(credentialPath, credential);
  await until(() => gw.requests.slice(mark).some((r) => r.endpoint === 'state'), 'polling resumed');
  await until(() => gw.requests.slice(mark).some((r) => r.endpoint === 'presence'), 'presence resumed');
  t.pass('resumed');
});

checkNoLeaks(t);
