import { Option, type Command } from 'commander';
import { hookEnabled } from '../service/test-hooks.js';
import type { PartObserver } from '../http/loopback-service.js';

/**
 * The variable lets a unit drop-in turn metrics on with one `Environment=` line, leaving
 * `ExecStart=` (and the node path install rendered into it) alone.
 */
export const METRICS_LISTEN_ENV = 'AGENT_CONNECTORS_METRICS_LISTEN';

/**
 * `--metrics-listen`, declared here once for every long-running part. Off unless given
 * for the production parts; `dev` passes its own default (metrics are part of trying the
 * product) and reads no environment (the variable is meant for a unit drop-in).
 */
export function addMetricsFlag(cmd: Command, dev?: { default: string }): Command {
  const option = new Option('--metrics-listen <host:port|off>', 'serve Prometheus metrics at http://HOST:PORT/metrics (loopback only, a port of its own)');
  if (dev) return cmd.addOption(option.default(dev.default));
  // `dev` runs as one user, who may read its own metrics; nobody else needs a say there.
  const allowed = new Option('--metrics-allowed-uids <list>', 'besides root and the service user, these local users (UIDs or names, comma-separated; e.g. the Prometheus scraper\'s) may read the metrics');
  return cmd.addOption(option.env(METRICS_LISTEN_ENV).default('off')).addOption(allowed.env(METRICS_ALLOWED_UIDS_ENV));
}

/** `--metrics-allowed-uids` from a unit drop-in's `Environment=`, like the listen address. */
export const METRICS_ALLOWED_UIDS_ENV = 'AGENT_CONNECTORS_METRICS_ALLOWED_UIDS';

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
