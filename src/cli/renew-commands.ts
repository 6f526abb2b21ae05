import { join, resolve } from 'node:path';
import { type Command } from 'commander';
import { z } from 'zod';
import { ConfigError } from '../errors.js';
import { upstreamUrlSchema } from '../data/fields.js';
import { stateLayout } from '../data/state-layout.js';
import { createApplyService } from '../renew/apply-service.js';
import { createFetchService, defaultFetchConfig } from '../renew/fetch-service.js';
import { handoffPaths } from '../data/handoff.js';
import { tokenFilesFor } from '../renew/token-targets.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices } from '../service/service.js';
import { installShims } from '../shims/install.js';
import { DEFAULT_CLI_PROXY_LISTEN, defaultShimDir } from './cli-proxy-commands.js';
import { layoutFrom, logLevelOption, loggerFrom, parseOption, positiveInt } from './options.js';

/** An http://127.0.0.1:<port> style URL, as its origin (the shims talk to loopback only). */
const loopbackOrigin = z
  .string()
  .url()
  .transform((v) => new URL(v))
  .refine((u) => u.protocol === 'http:' && ['127.0.0.1', 'localhost', '[::1]'].includes(u.hostname), 'must be an http URL on loopback')
  .transform((u) => u.origin);

/** Where apply writes token files unless a binding or the catalog names another path. */
export function defaultTokenDirs(stateDir: string): string[] {
  const layout = stateLayout(stateDir);
  return [layout.forwarderDir, layout.cliProxyDir];
}

export function registerRenewCommands(program: Command): void {
  const renew = program.command('renew').description('token renewal: fetch (holds the host credential) and apply (writes token files)');

  renew
    .command('fetch')
    .description('renew due slots against the Gateway and hand the results to apply')
    .option('--gateway <url>', 'Gateway base URL (default: $AGENT_CONNECTORS_GATEWAY_URL)')
    .option('--credential <file>', 'host credential file (default: $CREDENTIALS_DIRECTORY/host-credential)')
    .option('--handoff <dir>', 'hand-off directory (default: <state>/handoff)')
    .option('--state-dir <dir>', 'state root; fetch keeps its private state in <state>/renew-fetch')
    .option('--once', 'settle every due slot, then exit (for a timer); exit 1 if any did not settle')
    .option('--once-budget-ms <n>', 'with --once, how long retries may take', String(defaultFetchConfig.onceBudgetMs))
    .option('--backoff-cap-ms <n>', 'longest wait between retries', String(defaultFetchConfig.backoff.capMs))
    .addOption(logLevelOption())
    .action(async (opts: Record<string, string | boolean | undefined>) => {
      const log = loggerFrom(opts);
      const layout = layoutFrom(opts);
      const gateway = (opts.gateway as string | undefined) ?? process.env.AGENT_CONNECTORS_GATEWAY_URL;
      if (!gateway) throw new ConfigError('--gateway (or $AGENT_CONNECTORS_GATEWAY_URL) is required');
      const gatewayUrl = parseOption(upstreamUrlSchema, gateway, '--gateway');
      const credentialPath = opts.credential
        ? resolve(opts.credential as string)
        : process.env.CREDENTIALS_DIRECTORY
          ? join(process.env.CREDENTIALS_DIRECTORY, 'host-credential')
          : undefined;
      if (!credentialPath) throw new ConfigError('--credential FILE is required outside systemd (no $CREDENTIALS_DIRECTORY)');
      const service = createFetchService({
        ...defaultFetchConfig,
        gatewayUrl,
        credentialPath,
        handoffDir: layout.handoff,
        privateDir: layout.fetchPrivate,
        once: Boolean(opts.once),
        onceBudgetMs: parseOption(positiveInt, opts.onceBudgetMs, '--once-budget-ms'),
        backoff: { ...defaultFetchConfig.backoff, capMs: parseOption(positiveInt, opts.backoffCapMs, '--backoff-cap-ms') },
      });
      await runServices([service], { log, notifier: createNotifier({ log }) });
    });

  renew
    .command('apply')
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
      const targets = { stateDir: layout.root, instancesPath: layout.instances, providersPath: layout.providers };
      const shimDir = resolve(typeof opts.shimDir === 'string' ? opts.shimDir : defaultShimDir(layout.root));
      const proxyUrl = parseOption(loopbackOrigin, opts.proxyUrl ?? `http://${DEFAULT_CLI_PROXY_LISTEN}`, '--proxy-url');
      const service = createApplyService({
        watch: Boolean(opts.watch),
        rescanMs: 30_000,
        paths: handoffPaths(layout.handoff),
        tokenFilesFor: (slot) => tokenFilesFor(slot, targets),
        tokenDirs: defaultTokenDirs(layout.root),
        reconcile: {
          layout,
          instancesPath: layout.instances,
          providersPath: layout.providers,
          renderShims: async (catalog) => {
            const r = await installShims(catalog, shimDir, proxyUrl);
            log.info({ dir: shimDir, written: r.written.length, removed: r.removed.length }, 'shims rendered');
          },
        },
      });
      await runServices([service], { log, notifier: createNotifier({ log }) });
    });
}
