import { Counter, Gauge, type Registry } from 'prom-client';

/**
 * The state poll's condition: `starting` (no poll answered yet), `synced` (the last poll
 * answered), `retrying` (failing and backing off; the last good desired state stays),
 * `halted` (the Gateway refused the host credential: re-enrol), `no_credential` (the
 * credential file is unusable).
 */
export const LINK_STATES = ['starting', 'synced', 'retrying', 'halted', 'no_credential'] as const;
export type LinkState = (typeof LINK_STATES)[number];

export const POLL_RESULTS = ['unchanged', 'state', 'retry', 'credential_invalid'] as const;
export type PollResult = (typeof POLL_RESULTS)[number];

export interface LinkMetrics {
  polled(result: PollResult): void;
  state(state: LinkState): void;
}

export function createLinkMetrics(registry: Registry): LinkMetrics {
  const registers = [registry];
  const state = new Gauge({
    name: 'agent_connectors_link_state',
    help: 'The link\'s state poll: 1 for the state it is in, 0 for the others.',
    labelNames: ['state'] as const,
    registers,
  });
  const polls = new Counter({
    name: 'agent_connectors_link_polls_total',
    help: 'Desired-state polls, by result (state: a new desired state was handed to apply).',
    labelNames: ['result'] as const,
    registers,
  });
  const lastSync = new Gauge({
    name: 'agent_connectors_link_last_sync_timestamp_seconds',
    help: 'When a desired-state poll last succeeded (Unix time); 0 before the first.',
    registers,
  });
  const setState = (current: LinkState): void => {
    for (const s of LINK_STATES) state.set({ state: s }, s === current ? 1 : 0);
  };
  for (const result of POLL_RESULTS) polls.inc({ result }, 0);
  lastSync.set(0);
  setState('starting');

  return {
    polled(result) {
      polls.inc({ result });
      if (result === 'unchanged' || result === 'state') {
        lastSync.set(Date.now() / 1000);
        setState('synced');
      } else if (result === 'retry') setState('retrying');
      else setState('halted');
    },
    state: setState,
  };
}
