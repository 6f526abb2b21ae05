import { resolve } from 'node:path';
import type { Command } from 'commander';
import { handoffPaths } from '../data/handoff.js';
import { defaultCaBundle, SYSTEM_SHIM_DIR, stateLayout, type StateLayout } from '../data/state-layout.js';
import { ALLOWED_COMMANDS_FILE } from '../data/allowed-commands.js';
import type { PartsConfig, ShimTarget } from './build-parts.js';
import { DEFAULT_CLI_PROXY_LISTEN } from './defaults.js';
import { addMetricsFlag } from './metrics-flag.js';
import { layoutFrom, logLevelOption, loopbackHttpUrl, OptionErrors } from './options.js';
import { metricsTarget, str, type Opts } from './part-flags.js';


export function addApplyFlags(cmd: Command): Command {
  return addMetricsFlag(cmd)
    .option('--handoff <dir>', 'hand-off directory (default: <state>/handoff)')
    .option('--state-dir <dir>', 'state root (token files, instances.json, providers.json)')
    .option('--instances <file>', 'binding registry (default: <state>/mcp-forwarder/instances.json)')
    .option('--providers <file>', 'cli-proxy catalog (default: <state>/cli-proxy/providers.json)')
    .option('--shim-dir <dir>', `where the desired state's shims are rendered (default: ${SYSTEM_SHIM_DIR} as root, else <state>/shims)`)
    .option('--proxy-url <url>', 'cli-proxy base URL baked into those shims', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--allowed-commands <file>', `host tools the operator lets a catalog shim, one per line (default: ${ALLOWED_COMMANDS_FILE})`)
    .option('--watch', 'keep running and apply as files arrive (hosts without systemd)')
    .addOption(logLevelOption());
}

/** Apply's config for a layout: watching, shims in `shimDir` pointing at `proxyUrl`. */
/** `shims.caBundle` defaults to the state root's, where the cli-proxy of the same root writes it. */
export function applyConfig(layout: StateLayout, shims: Omit<ShimTarget, 'caBundle'> & { caBundle?: string | undefined }, watch = true): NonNullable<PartsConfig['apply']> {
  return { watch, rescanMs: 30_000, paths: handoffPaths(layout.handoff), layout, shims: { ...shims, caBundle: shims.caBundle ?? defaultCaBundle(layout.root) } };
}

export function applyPartsFrom(opts: Opts): PartsConfig {
  const errors = new OptionErrors();
  const layout = layoutFrom(opts);
  const proxyUrl = errors.parse(loopbackHttpUrl, opts.proxyUrl ?? `http://${DEFAULT_CLI_PROXY_LISTEN}`, '--proxy-url', `http://${DEFAULT_CLI_PROXY_LISTEN}`);
  const metrics = metricsTarget(opts, errors);
  if (metrics && !opts.watch) errors.add('--metrics-listen needs --watch: a one-shot apply exits before anything could scrape it');
  errors.done();
  const shimDir = resolve(str(opts.shimDir) ?? defaultShimDir(layout.root));
  const shims = { dir: shimDir, proxyUrl: new URL(proxyUrl).origin, allowedCommandsFile: str(opts.allowedCommands) };
  return { apply: applyConfig(layout, shims, Boolean(opts.watch)), metrics };
}


/** The shim directory of a system install as root, else the state root's. */
export function defaultShimDir(stateDir: string): string {
  return process.getuid?.() === 0 ? SYSTEM_SHIM_DIR : stateLayout(stateDir).shims;
}
