import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Counter, Gauge, Registry } from 'prom-client';

/**
 * The few process figures the dashboard shows, under prom-client's default names, all
 * computed when scraped. Not prom-client's collectDefaultMetrics: its GC observer runs a
 * callback on every collection and its delay monitor samples every 10 ms, and with both
 * the forwarder's CPU per request measured visibly higher (docs/metrics.md); these cost
 * nothing between scrapes but the delay monitor's one timer every 100 ms.
 */
export function registerProcessMetrics(registry: Registry): void {
  const registers = [registry];
  const delay = monitorEventLoopDelay({ resolution: 100 });
  delay.enable();
  new Counter({
    name: 'process_cpu_seconds_total',
    help: 'Total user and system CPU time spent in seconds.',
    registers,
    collect() {
      const u = process.cpuUsage();
      this.reset();
      this.inc((u.user + u.system) / 1e6);
    },
  });
  new Gauge({
    name: 'process_resident_memory_bytes',
    help: 'Resident memory size in bytes.',
    registers,
    collect() {
      this.set(process.memoryUsage.rss());
    },
  });
  new Gauge({
    name: 'nodejs_heap_size_used_bytes',
    help: 'Process heap size used from Node.js in bytes.',
    registers,
    collect() {
      this.set(process.memoryUsage().heapUsed);
    },
  });
  new Gauge({
    name: 'process_start_time_seconds',
    help: 'Start time of the process since unix epoch in seconds.',
    registers,
  }).set(Math.round(Date.now() / 1000 - process.uptime()));
  new Gauge({
    name: 'nodejs_eventloop_lag_p99_seconds',
    help: 'The 99th percentile of event loop delay since the last scrape, seconds.',
    registers,
    collect() {
      this.set(delay.count > 0 ? delay.percentile(99) / 1e9 : 0);
      delay.reset();
    },
  });
}

/**
 * Only the process series, labelled `part` = `label`: dev's, for the one process that
 * runs every part. No build info: the dashboard counts parts by that series.
 */
export function processRegistry(label: string): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part: label });
  registerProcessMetrics(registry);
  return registry;
}
