import { collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import { version } from '../version.js';

export const PARTS = ['forwarder', 'cli-proxy', 'link', 'apply'] as const;
export type Part = (typeof PARTS)[number];

/**
 * One registry per process, every series labelled with the part that serves it, so one
 * dashboard query covers all four parts (they scrape as separate targets). The process
 * and Node.js collectors (`process_*`, `nodejs_*`) are computed when scraped; the only
 * ones working between scrapes are the event-loop delay monitor and the GC observer.
 */
export function createRegistry(part: Part): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part });
  // The delay monitor samples with a timer: prom-client's 10 ms wakes an idle agent 100
  // times a second (≈ 4 ms of CPU a second on the test VM); 100 ms keeps the p99 honest
  // for a dashboard at a tenth of that.
  collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: 100 });
  const info = new Gauge({
    name: 'agent_connectors_build_info',
    help: 'Always 1; the version of the running agent-connectors.',
    labelNames: ['version'] as const,
    registers: [registry],
  });
  info.set({ version }, 1);
  return registry;
}
