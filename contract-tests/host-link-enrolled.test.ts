import t from 'tap';
import { craftedStates } from '../test/support/mock-host-gateway.js';
import { until } from '../test/support/poll.js';
import { appliedLine, HANDED_OVER, hostWorld } from './helpers/host-link-rig.js';

/**
 * Two defects of issue 19, black box (built CLI, real processes, the mock host Gateway):
 * - `link --credential F` after `enroll --credential F` needs nothing else: it reads the
 *   Gateway URL and host id enroll wrote in link.env beside F (SPEC §8).
 * - A versioned desired state that fails validation is final for that version (SPEC §8):
 *   the link hands it to apply, which rejects it and keeps the last good one; the poll goes
 *   past it at once, presence says state_rejected, and later faults (500, 429, garbage)
 *   do not hold back the good state that follows.
 */

t.test('link --credential F alone, after enroll --credential F: polls the desired state and reports presence', async (t) => {
  const w = await hostWorld(t);
  const apply = w.startApply();
  // No --gateway, no --host-id, no AGENT_CONNECTORS_* in its environment.
  const link = w.startLink({}, 'credential-only');
  w.gw.control.connectBinding('bind_enrolled_01', { instanceId: 'inst-enrolled-1', upstreamUrl: 'https://gw.example.com/mcp/enrolled' });
  const version = w.gw.control.version;
  await link.waitForLog((l) => l.msg === HANDED_OVER && l.version === version, 20_000);
  await apply.waitForLog(appliedLine(version), 20_000);
  await until(() => w.gw.control.presences.some((p) => p.body.hostId === w.linkEnv.AGENT_CONNECTORS_HOST_ID && p.body.stateVersion === version), 'presence with the applied version', 20_000);
  t.notOk(link.logs.some((l) => typeof l.msg === 'string' && l.msg.includes('running renewals only')), 'not renewals only');
});

t.test('a rejected state is final for its version: reported, passed, and the good state after 500, 429 and garbage is applied within 15 s', async (t) => {
  const w = await hostWorld(t);
  const apply = w.startApply();
  const link = w.startLink();
  w.gw.control.connectBinding('bind_good_0001', { instanceId: 'inst-good-1', upstreamUrl: 'https://gw.example.com/mcp/good' });
  const good = w.gw.control.version;
  await apply.waitForLog(appliedLine(good), 20_000);

  // The Gateway publishes a state apply must reject, then fails three ways.
  const rejected = good + 1;
  w.gw.inject({ kind: 'body', body: craftedStates.httpUpstream(rejected) }, { endpoint: 'state' });
  w.gw.inject({ kind: 'status5xx', status: 500 }, { endpoint: 'state' });
  w.gw.inject({ kind: 'status429', retryAfterS: 1 }, { endpoint: 'state' });
  w.gw.inject({ kind: 'notJson' }, { endpoint: 'state' });
  // The poll in flight ends unanswered (204 after the mock's hold); the faults meet the polls after it.
  await link.waitForLog((l) => l.msg === HANDED_OVER && l.version === rejected, 20_000);
  await apply.waitForLog((l) => typeof l.msg === 'string' && l.msg.startsWith('desired state rejected') && l.version === rejected, 20_000);
  await until(() => w.gw.control.presences.some((p) => p.body.problems.includes('state_rejected')), 'presence reports state_rejected', 20_000);
  await until(() => w.gw.pendingFaults() === 0, 'the 500, the 429 and the garbage answered', 20_000);

  // The fix: a newer valid state, published after the faults. The mock's own version
  // counter does not know the crafted version, so it steps past it first.
  w.gw.control.connectBinding('bind_good_0002', { instanceId: 'inst-good-2', upstreamUrl: 'https://gw.example.com/mcp/good2' });
  w.gw.control.connectBinding('bind_good_0003', { instanceId: 'inst-good-3', upstreamUrl: 'https://gw.example.com/mcp/good3' });
  t.ok(w.gw.control.version > rejected, 'the fix is newer than the rejected version');
  const fixed = w.gw.control.version;
  const publishedAt = Date.now();
  await apply.waitForLog(appliedLine(fixed), 30_000);
  const tookMs = Date.now() - publishedAt;
  t.ok(tookMs <= 15_000, `the good state applied ${tookMs} ms after it was published (≤ 15 s)`);
  await until(
    () => w.gw.control.presences.some((p) => p.body.stateVersion === fixed && !p.body.problems.includes('state_rejected')),
    'presence: the good version in force, no longer state_rejected',
    20_000,
  );
  t.notOk(link.lines.some((l) => l.includes('http://gw.example.com')), 'no body in the link log');
});
