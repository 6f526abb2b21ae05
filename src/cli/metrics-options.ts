import { Option, type Command } from 'commander';
import type { Registry } from 'prom-client';
import type { ListenAddress } from '../http/loopback.js';
import { createMetricsService, parseMetricsListen } from '../metrics/metrics-service.js';
import { createRegistry, type Part } from '../metrics/registry.js';
import type { Service } from '../service/service.js';
import { hookEnabled } from '../service/test-hooks.js';
import type { PartObserver } from '../http/loopback-service.js';

/**
 * The variable lets a unit drop-in turn metrics on with one `Environment=` line, leaving
 * `ExecStart=` (and the node path install rendered into it) alone.
 */
export const METRICS_LISTEN_ENV = 'AGENT_CONNECTORS_METRICS_LISTEN';

/** `--metrics-listen`, the same on every long-running part; off unless given. */
export function addMetricsOption(cmd: Command): Command {
  return cmd.addOption(
    new Option('--metrics-listen <host:port|off>', 'serve Prometheus metrics at http://HOST:PORT/metrics (loopback only, a port of its own)').env(METRICS_LISTEN_ENV).default('off'),
  );
}

export interface PartMetrics {
  registry: Registry;
  /** The /metrics endpoint, run beside the part. */
  service: Service;
}

/** The part's registry and endpoint, or undefined when metrics are off. */
export function metricsFrom(opts: { metricsListen?: unknown }, part: Part, partListen?: ListenAddress): PartMetrics | undefined {
  const listen = parseMetricsListen(typeof opts.metricsListen === 'string' ? opts.metricsListen : undefined, partListen);
  if (!listen) return undefined;
  const registry = createRegistry(part);
  return { registry, service: createMetricsService({ listen, registry }) };
}

/**
 * Test hook `metrics-toggle` (AGENT_CONNECTORS_TEST_HOOKS): SIGUSR2 switches the request
 * observer off and on in a running process, so `npm run bench -- --metrics` can compare
 * metrics on and off in one process (two processes differ by more than the 2 % measured).
 * Without the hook, the observer as it is.
 */
export function benchToggle(observer: PartObserver): PartObserver {
  if (!hookEnabled('metrics-toggle')) return observer;
  let on = true;
  process.on('SIGUSR2', () => {
    on = !on;
  });
  return {
    closed: (req, rec, seconds) => void (on && observer.closed(req, rec, seconds)),
    answering: (res, contentType) => void (on && observer.answering(res, contentType)),
    configLoaded: (ok, count) => observer.configLoaded(ok, count),
  };
}
