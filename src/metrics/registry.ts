import { Gauge, Registry } from 'prom-client';
import { version } from '../version.js';
import { registerProcessMetrics } from './process-metrics.js';

export const PARTS = ['forwarder', 'cli-proxy', 'link', 'apply'] as const;
export type Part = (typeof PARTS)[number];

/**
 * One registry per process, every series labelled with the part that serves it, so one
 * dashboard query covers all four parts (they scrape as separate targets). `dev` runs all
 * parts in one process: it builds their registries without the process series and keeps
 * those in one registry of its own (`processRegistry`, process-metrics.ts), so they are not counted four times.
 */
export function createRegistry(part: Part, options: { processMetrics?: boolean } = {}): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part });
  if (options.processMetrics ?? true) registerProcessMetrics(registry);
  const info = new Gauge({
    name: 'agent_connectors_build_info',
    help: 'Always 1; the version of the running agent-connectors.',
    labelNames: ['version'] as const,
    registers: [registry],
  });
  info.set({ version }, 1);
  return registry;
}
