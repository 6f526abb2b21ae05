import { Option } from 'commander';
import type { PartObserver } from '../http/loopback-service.js';
import type { ListenAddress } from '../http/loopback.js';
import { createHttpMetrics } from '../metrics/http-metrics.js';
import { createLinkMetrics, type LinkMetrics } from '../metrics/link-metrics.js';
import { mergedExposition } from '../metrics/merged-exposition.js';
import { createMetricsService, parseMetricsListen } from '../metrics/metrics-service.js';
import { processRegistry } from '../metrics/process-metrics.js';
import { createRegistry } from '../metrics/registry.js';
import { createApplyMetrics, createRenewalMetrics, type ApplyMetrics, type RenewalMetrics } from '../metrics/renewal-metrics.js';
import type { Service } from '../service/service.js';

/**
 * On by default in dev (it is for trying the product, and metrics are part of it), at a
 * fixed port so a local Prometheus keeps scraping across restarts: the forwarder's
 * suggested metrics port, free in dev since all parts share one process and one port.
 */
export const DEFAULT_DEV_METRICS_LISTEN = '127.0.0.1:14325';

/**
 * dev's own `--metrics-listen`: not the parts' option, which is off by default and reads
 * $AGENT_CONNECTORS_METRICS_LISTEN (meant for a unit drop-in, not for dev).
 */
export function devMetricsOption(): Option {
  return new Option('--metrics-listen <host:port|off>', 'serve every part\'s Prometheus metrics at http://HOST:PORT/metrics (loopback only)').default(DEFAULT_DEV_METRICS_LISTEN);
}

/** What each part of dev reports to, and the one endpoint serving all of it. */
export interface DevMetrics {
  forwarder: PartObserver;
  cliProxy: PartObserver;
  renewal: RenewalMetrics;
  link: LinkMetrics;
  apply: ApplyMetrics;
  listen: ListenAddress;
  service: Service;
}

/**
 * Each part gets its own registry, as in production, so its series carry its `part` label
 * and a dashboard built on the production targets works on dev unchanged. The process
 * series (CPU, memory, event loop) are the one process's: they appear once, as part `dev`,
 * rather than under one part that would then seem to use the CPU of all four.
 */
export function devMetrics(value: string, partPorts: readonly ListenAddress[], onListening: (port: number) => void): DevMetrics | undefined {
  const listen = parseMetricsListen(value);
  if (!listen) return undefined;
  // The parts share dev's process, not their ports: none of theirs may be the metrics port.
  for (const part of partPorts) parseMetricsListen(value, part);
  const registries = {
    forwarder: createRegistry('forwarder', { processMetrics: false }),
    cliProxy: createRegistry('cli-proxy', { processMetrics: false }),
    link: createRegistry('link', { processMetrics: false }),
    apply: createRegistry('apply', { processMetrics: false }),
  };
  const exposition = mergedExposition([...Object.values(registries), processRegistry('dev')]);
  return {
    forwarder: createHttpMetrics(registries.forwarder, 'instances.json'),
    cliProxy: createHttpMetrics(registries.cliProxy, 'providers.json'),
    renewal: createRenewalMetrics(registries.link),
    link: createLinkMetrics(registries.link),
    apply: createApplyMetrics(registries.apply),
    listen,
    service: createMetricsService({ listen, registry: exposition, onListening }),
  };
}
