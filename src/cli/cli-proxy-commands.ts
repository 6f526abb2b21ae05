import { resolve } from 'node:path';
import { Option, type Command } from 'commander';
import { readCatalog } from '../data/catalog.js';
import { createCliProxyService } from '../cli-proxy/cli-proxy-service.js';
import { stateLayout, SYSTEM_SHIM_DIR } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { parseListen } from '../http/loopback.js';
import { handoffPaths } from '../data/handoff.js';
import { ensureSlot } from '../apply/slot-admin.js';
import { cliSlot } from '../data/renew-wire.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices } from '../service/service.js';
import { installShims } from '../shims/install.js';
import { AGENTS, type AgentName } from './mcp-add.js';
import { createHttpMetrics } from '../metrics/http-metrics.js';
import { addMetricsOption, metricsFrom } from './metrics-options.js';
import { addServerOptions, layoutFrom, loggerFrom, parseOption, positiveInt, serverOptions } from './options.js';
import { DEFAULT_AUDIT_MAX_EVENTS } from '../cli-proxy/audit-spool.js';
import { DEFAULT_CLI_BODY_LIMIT, DEFAULT_CLI_PROXY_LISTEN } from './defaults.js';


export function defaultShimDir(stateDir: string): string {
  return process.getuid?.() === 0 ? SYSTEM_SHIM_DIR : stateLayout(stateDir).shims;
}

/** How to give an agent the shim directory (it needs only that directory first on PATH). */
export function pathSetupCommand(agent: AgentName, dir: string): string {
  switch (agent) {
    case 'openclaw':
      return `openclaw config set tools.exec.pathPrepend ${dir}`;
    case 'claude':
      return `PATH=${dir}:$PATH claude   # or put ${dir} first on PATH in the agent user's environment`;
    case 'codex':
      return `PATH=${dir}:$PATH codex    # or put ${dir} first on PATH in the agent user's environment`;
  }
}

export function registerCliProxyCommands(program: Command): void {
  addServerOptions(
    addMetricsOption(program.command('cli-proxy'))
      .description('serve http://127.0.0.1:14324/p/<provider>/…, injecting each provider\'s token for shell CLIs')
      .option('--state-dir <dir>', 'state root')
      .option('--providers <file>', 'provider catalog (default: <state>/cli-proxy/providers.json)')
      .option('--audit-dir <dir>', 'spool of native_cli audit events, uploaded by the link (default: <state>/audit)')
      .option('--audit-max-events <n>', 'spool bound: past it the oldest events are dropped and counted', String(DEFAULT_AUDIT_MAX_EVENTS))
      .option('--no-audit', 'write no audit events'),
    { listen: DEFAULT_CLI_PROXY_LISTEN, bodyLimit: DEFAULT_CLI_BODY_LIMIT },
  ).action(async (opts: Record<string, string | boolean | undefined>) => {
    const log = loggerFrom(opts);
    const layout = layoutFrom(opts);
    const audit =
      opts.audit === false
        ? undefined
        : {
            dir: typeof opts.auditDir === 'string' ? resolve(opts.auditDir) : layout.audit,
            maxEvents: parseOption(positiveInt, opts.auditMaxEvents, '--audit-max-events'),
          };
    const server = serverOptions(opts);
    const metrics = metricsFrom(opts, 'cli-proxy', server.listen);
    const service = createCliProxyService({
      config: { ...server, providersPath: layout.providers, audit, observer: metrics && createHttpMetrics(metrics.registry, 'providers.json') },
    });
    await runServices(metrics ? [service, metrics.service] : [service], { log, notifier: createNotifier({ log }) });
  });

  const shims = program.command('shims').description('PATH shims that point shell CLIs at the cli-proxy');
  shims
    .command('install')
    .description('write one shim per catalog command into the shim directory (and remove stale ones)')
    .option('--dir <dir>', `shim directory (default: ${SYSTEM_SHIM_DIR} as root, else <state>/shims)`)
    .option('--proxy-url <url>', 'cli-proxy base URL baked into the shims', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--state-dir <dir>', 'state root')
    .option('--providers <file>', 'provider catalog (default: <state>/cli-proxy/providers.json)')
    .option('--handoff <dir>', 'renewal hand-off directory, for the providers\' cli:<provider> slots (default: <state>/handoff)')
    .action(async (opts: Record<string, string | undefined>) => {
      const layout = layoutFrom(opts);
      const catalog = await readCatalog(layout.providers);
      const proxyUrl = opts.proxyUrl ?? `http://${DEFAULT_CLI_PROXY_LISTEN}`;
      let parsedProxy: URL;
      try {
        parsedProxy = new URL(proxyUrl);
      } catch {
        throw new ConfigError(`--proxy-url is not a URL: ${proxyUrl}`);
      }
      parseListen(parsedProxy.host); // loopback only, like the proxy itself
      const dir = resolve(opts.dir ?? defaultShimDir(layout.root));
      const result = await installShims(catalog, dir, parsedProxy.origin);
      const paths = handoffPaths(layout.handoff);
      for (const provider of Object.keys(catalog)) await ensureSlot(paths, cliSlot(provider));
      process.stdout.write(
        `${[`shims in ${dir}: ${result.written.join(', ') || '(none)'}`, result.removed.length ? `removed stale: ${result.removed.join(', ')}` : '']
          .filter(Boolean)
          .join('\n')}\n`,
      );
    });
  shims
    .command('path')
    .description('print how to put the shim directory first on an agent\'s PATH')
    .addOption(new Option('--agent <agent>', 'which agent').choices([...AGENTS]).makeOptionMandatory())
    .option('--dir <dir>', 'shim directory')
    .option('--state-dir <dir>', 'state root')
    .action((opts: { agent: AgentName; dir?: string; stateDir?: string }) => {
      process.stdout.write(`${pathSetupCommand(opts.agent, resolve(opts.dir ?? defaultShimDir(layoutFrom(opts).root)))}\n`);
    });
}
