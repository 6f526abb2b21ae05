import { resolve } from 'node:path';
import { type Command } from 'commander';
import { ConfigError } from '../errors.js';
import { createApplyService } from '../apply/apply-service.js';
import { handoffPaths } from '../data/handoff.js';
import { createApplyMetrics } from '../metrics/renewal-metrics.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices } from '../service/service.js';
import { installShims } from '../shims/install.js';
import { defaultShimDir } from './cli-proxy-commands.js';
import { DEFAULT_CLI_PROXY_LISTEN } from './defaults.js';
import { addLinkOptions, runLink } from './link-commands.js';
import { addMetricsOption, metricsFrom } from './metrics-options.js';
import { layoutFrom, logLevelOption, loggerFrom, loopbackHttpUrl, parseOption } from './options.js';

export function registerRenewCommands(program: Command): void {
  const renew = program.command('renew').description('token renewal: fetch (holds the host credential) and apply (writes token files)');

  addLinkOptions(
    renew
      .command('fetch')
      .description('alias of `agent-connectors link`: renewals, and on an enrolled host the state poll and presence'),
  ).action(runLink);

  addMetricsOption(renew.command('apply'))
    .description('write fetched tokens from the hand-off inbox into token files')
    .option('--handoff <dir>', 'hand-off directory (default: <state>/handoff)')
    .option('--state-dir <dir>', 'state root (token files, instances.json, providers.json)')
    .option('--instances <file>', 'binding registry (default: <state>/mcp-forwarder/instances.json)')
    .option('--providers <file>', 'cli-proxy catalog (default: <state>/cli-proxy/providers.json)')
    .option('--shim-dir <dir>', 'where the desired state\'s shims are rendered (default: /var/lib/agent-connectors-shims as root, else <state>/shims)')
    .option('--proxy-url <url>', 'cli-proxy base URL baked into those shims', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--watch', 'keep running and apply as files arrive (hosts without systemd)')
    .addOption(logLevelOption())
    .action(async (opts: Record<string, string | boolean | undefined>) => {
      const log = loggerFrom(opts);
      const layout = layoutFrom(opts);
      const shimDir = resolve(typeof opts.shimDir === 'string' ? opts.shimDir : defaultShimDir(layout.root));
      const proxyUrl = new URL(parseOption(loopbackHttpUrl, opts.proxyUrl ?? `http://${DEFAULT_CLI_PROXY_LISTEN}`, '--proxy-url')).origin;
      const metrics = metricsFrom(opts, 'apply');
      if (metrics && !opts.watch) throw new ConfigError('--metrics-listen needs --watch: a one-shot apply exits before anything could scrape it');
      const service = createApplyService({
        watch: Boolean(opts.watch),
        rescanMs: 30_000,
        paths: handoffPaths(layout.handoff),
        layout,
        reconcile: {
          renderShims: async (catalog) => {
            const r = await installShims(catalog, shimDir, proxyUrl);
            log.info({ dir: shimDir, written: r.written.length, removed: r.removed.length }, 'shims rendered');
          },
        },
        metrics: metrics && createApplyMetrics(metrics.registry),
      });
      await runServices(metrics ? [service, metrics.service] : [service], { log, notifier: createNotifier({ log }) });
    });
}
