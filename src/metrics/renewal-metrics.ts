import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { CappedLabel } from './labels.js';

/** What one renewal attempt came to (renew fetch's outcomes). */
export const RENEWAL_RESULTS = ['renewed', 'conflict', 'revoked', 'retry', 'credential_invalid'] as const;
export type RenewalResult = (typeof RENEWAL_RESULTS)[number];

const FAILED: ReadonlySet<RenewalResult> = new Set(['retry', 'credential_invalid']);

/** What renew fetch reports (tbot's tbot_task_iterations_* shape). */
export interface RenewalMetrics {
  /** One renewal attempt of `slot`, its result and how long the Gateway exchange took. */
  iteration(result: RenewalResult, seconds: number): void;
  /** The newest token of `slot` expires at `expiresAt` (ISO 8601). */
  expiry(slot: string, expiresAt: string): void;
  /** A slot that is gone or revoked: its expiry series goes with it. */
  forget(slot: string): void;
}

/** What renew apply reports: one pass over the inbox. */
export interface ApplyMetrics {
  applied(stats: { applied: number; ignored: number; rejected: number }): void;
}

export function createRenewalMetrics(registry: Registry): RenewalMetrics {
  const registers = [registry];
  const iterations = new Counter({
    name: 'agent_connectors_renewal_iterations_total',
    help: 'Renewal attempts (one Gateway exchange each), by result.',
    labelNames: ['result'] as const,
    registers,
  });
  const failures = new Counter({
    name: 'agent_connectors_renewal_failures_total',
    help: 'Renewal attempts that failed and will be retried (network, 5xx, 429, invalid answer) or hit a rejected host credential.',
    labelNames: ['result'] as const,
    registers,
  });
  const duration = new Histogram({
    name: 'agent_connectors_renewal_duration_seconds',
    help: 'Duration of one renewal attempt (the Gateway exchange and the hand-off write).',
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers,
  });
  const expiry = new Gauge({
    name: 'agent_connectors_token_expiry_timestamp_seconds',
    help: 'When the newest token of each renewal slot expires (Unix time).',
    labelNames: ['slot'] as const,
    registers,
  });
  for (const result of RENEWAL_RESULTS) iterations.inc({ result }, 0);
  for (const result of FAILED) failures.inc({ result }, 0);
  // A host has as many slots as bindings and providers; the cap guards against a Gateway
  // handing out an unbounded stream of them.
  const slots = new CappedLabel(500);

  return {
    iteration(result, seconds) {
      iterations.inc({ result });
      if (FAILED.has(result)) failures.inc({ result });
      duration.observe(seconds);
    },
    expiry(slot, expiresAt) {
      const at = Date.parse(expiresAt);
      if (Number.isFinite(at)) expiry.set({ slot: slots.of(slot) }, at / 1000);
    },
    forget(slot) {
      expiry.remove({ slot: slots.of(slot) });
    },
  };
}

export function createApplyMetrics(registry: Registry): ApplyMetrics {
  const applied = new Counter({
    name: 'agent_connectors_apply_tokens_total',
    help: 'Tokens renew apply took from the hand-off inbox, by result.',
    labelNames: ['result'] as const,
    registers: [registry],
  });
  const results = ['applied', 'ignored', 'rejected'] as const;
  for (const result of results) applied.inc({ result }, 0);
  return {
    applied(stats) {
      for (const result of results) if (stats[result] > 0) applied.inc({ result }, stats[result]);
    },
  };
}
