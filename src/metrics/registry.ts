import { collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import { version } from '../version.js';

export const PARTS = ['forwarder', 'cli-proxy', 'link', 'apply'] as const;
export type Part = (typeof PARTS)[number];

/**
 * One registry per process, every series labelled with the part that serves it, so one
 * dashboard query covers all four parts (they scrape as separate targets). The process
 * and Node.js collectors (`process_*`, `nodejs_*`) are computed when scraped; the only
 * one working between scrapes is the event-loop delay monitor.
 */
export function createRegistry(part: Part): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part });
  collectDefaultMetrics({ register: registry });
  const info = new Gauge({
    name: 'agent_connectors_build_info',
    help: 'Always 1; the version of the running agent-connectors.',
    labelNames: ['version'] as const,
    registers: [registry],
  });
  info.set({ version }, 1);
  return registry;
}
