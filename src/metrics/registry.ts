import { Gauge, Registry } from 'prom-client';
import { version } from '../version.js';
import { registerProcessMetrics } from './process-metrics.js';

export const PARTS = ['forwarder', 'cli-proxy', 'link', 'apply'] as const;
export type Part = (typeof PARTS)[number];

/**
 * One registry per process, every series labelled with the part that serves it, so one
 * dashboard query covers all four parts (they scrape as separate targets).
 */
export function createRegistry(part: Part): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part });
  registerProcessMetrics(registry);
  const info = new Gauge({
    name: 'agent_connectors_build_info',
    help: 'Always 1; the version of the running agent-connectors.',
    labelNames: ['version'] as const,
    registers: [registry],
  });
  info.set({ version }, 1);
  return registry;
}
