import { parseMetricsListen } from '../metrics/metrics-service.js';
import type { MetricsTarget } from './build-parts.js';
import { parseAllowedUids, type OptionErrors } from './options.js';

/**
 * Each part's flags are declared once with their defaults, beside the one function per
 * part that turns them into its typed config (every problem reported together): the
 * forwarder and cli-proxy in proxy-parts.ts, the link in link-part.ts, apply in
 * apply-part.ts. The commands and their aliases (`renew fetch`) only pick a part; `dev`
 * builds the same configs in code. One file per part, so a command loads only its own.
 */

export type Opts = Record<string, string | boolean | undefined>;

export function str(v: unknown): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

/** `--metrics-listen` as a target; a part's own port is refused in buildParts. */
export function metricsTarget(opts: Opts, errors: OptionErrors): MetricsTarget | undefined {
  const listen = errors.attempt(() => parseMetricsListen(str(opts.metricsListen)), undefined);
  const allowedUids = errors.attempt(() => parseAllowedUids(str(opts.metricsAllowedUids), undefined, '--metrics-allowed-uids'), undefined);
  return listen && { listen, allowedUids };
}

