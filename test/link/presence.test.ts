import { once } from 'node:events';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { Agent } from 'undici';
import { presenceSchema } from '../../src/data/link-wire.js';
import { MAX_HEALTH_BYTES } from '../../src/http/health-probe.js';
import { buildPresence, defaultPresenceConfig, partHealth, type PresenceConfig } from '../../src/link/presence.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

async function part(t: TapTest, status: number, body: string): Promise<string> {
  const server = createServer((_req, res) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(body);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/healthz`;
}

function config(handoffDir: string, health: Record<string, string>): PresenceConfig {
  return { ...defaultPresenceConfig, handoffDir, hostId: 'host-1', version: '0.1.0', health };
}

t.test('partHealth: ok, degraded (not ok, not 200, not JSON), down (no answer)', async (t) => {
  const agent = new Agent({ headersTimeout: 2_000 });
  t.teardown(() => agent.close());
  const signal = new AbortController().signal;
  t.equal(await partHealth(agent, await part(t, 200, '{"status":"ok"}'), signal), 'ok');
  t.equal(await partHealth(agent, await part(t, 200, '{"status":"degraded"}'), signal), 'degraded');
  t.equal(await partHealth(agent, await part(t, 503, '{}'), signal), 'degraded');
  t.equal(await partHealth(agent, await part(t, 200, '<html>'), signal), 'degraded');
  t.equal(await partHealth(agent, 'http://127.0.0.1:9/healthz', signal), 'down');
});

t.test('partHealth: an answer past MAX_HEALTH_BYTES, or one that trickles past the timeout, is down', async (t) => {
  const agent = new Agent();
  t.teardown(() => agent.close());
  const signal = new AbortController().signal;
  t.equal(await partHealth(agent, await part(t, 200, `{"status":"ok","pad":"${' '.repeat(MAX_HEALTH_BYTES)}"}`), signal), 'down', 'oversized');
  t.equal(await partHealth(agent, await part(t, 200, `{"status":"ok","pad":"${' '.repeat(MAX_HEALTH_BYTES - 40)}"}`), signal), 'ok', 'just under the bound');
  // One byte every 20 ms never pauses long enough for undici's body timeout; the whole-exchange deadline cuts it.
  const server = createServer((_req, res) => {
    res.writeHead(200);
    const timer = setInterval(() => res.write(' '), 20);
    res.on('close', () => clearInterval(timer));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise<void>((r) => server.close(() => r()));
  });
  t.equal(await partHealth(agent, `http://127.0.0.1:${(server.address() as AddressInfo).port}/healthz`, signal, 300), 'down', 'trickled');
});

t.test('buildPresence: nothing applied yet → stateVersion null, no slots; down parts named', async (t) => {
  const dir = tempDir('ac-presence-', t);
  const agent = new Agent();
  t.teardown(() => agent.close());
  const p = await buildPresence(config(dir, { forwarder: 'http://127.0.0.1:9/healthz', 'cli-proxy': 'http://127.0.0.1:9/healthz' }), agent, true, new AbortController().signal);
  t.same(p, { hostId: 'host-1', version: '0.1.0', stateVersion: null, parts: { forwarder: 'down', 'cli-proxy': 'down' }, slots: [], problems: ['forwarder_down', 'cli_proxy_down'] });
});

t.test('buildPresence: applied version, slots without secrets, state_rejected, invalid slot file, credential_unusable', async (t) => {
  const dir = tempDir('ac-presence-', t);
  mkdirSync(join(dir, 'slots'));
  writeFileSync(
    join(dir, 'slots', 'cli:github.json'),
    JSON.stringify({ slot: 'cli:github', tokenId: 'tok_1', expiresAt: '2030-01-01T00:00:00Z', generation: 3, appliedAt: '2029-12-31T00:00:00Z' }),
  );
  writeFileSync(join(dir, 'slots', 'instance:bad.json'), '{"slot": "instance:other"}');
  writeFileSync(
    join(dir, 'applied-state.json'),
    JSON.stringify({ version: 4, appliedAt: '2030-01-01T00:00:00Z', rejected: { version: 5, error: 'bindings.bind: upstream must be https', at: '2030-01-01T00:00:01Z' } }),
  );
  const agent = new Agent();
  t.teardown(() => agent.close());
  const ok = await part(t, 200, '{"status":"ok"}');
  const p = await buildPresence(config(dir, { forwarder: ok }), agent, false, new AbortController().signal);
  t.ok(presenceSchema.safeParse(p).success, 'valid on the wire');
  t.equal(p.stateVersion, 4);
  t.same(p.slots, [{ slot: 'cli:github', tokenId: 'tok_1', expiresAt: '2030-01-01T00:00:00Z' }], 'slot, tokenId, expiresAt only');
  t.same(p.parts, { forwarder: 'ok' });
  t.same(p.problems, ['state_rejected', 'slot_file_invalid', 'credential_unusable']);
});

t.test('buildPresence: a rejection older than the applied version is not a problem', async (t) => {
  const dir = tempDir('ac-presence-', t);
  writeFileSync(join(dir, 'applied-state.json'), JSON.stringify({ version: 6, appliedAt: '2030-01-01T00:00:00Z', rejected: { version: 5, error: 'x', at: '2030-01-01T00:00:01Z' } }));
  const agent = new Agent();
  t.teardown(() => agent.close());
  const p = await buildPresence(config(dir, {}), agent, true, new AbortController().signal);
  t.equal(p.stateVersion, 6);
  t.same(p.problems, []);
});
