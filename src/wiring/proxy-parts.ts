import { resolve } from 'node:path';
import type { Command } from 'commander';
import { DEFAULT_AUDIT_MAX_EVENTS } from '../cli-proxy/audit-spool.js';
import { DEFAULT_BODY_LIMIT } from '../http/request-body.js';
import type { PartsConfig } from './build-parts.js';
import { CA_BUNDLE_FILE, defaultCaBundle, SYSTEM_CA_BUNDLE_DIR } from '../data/state-layout.js';
import { parseResolve } from '../cli-proxy/tls-upstream.js';
import { DEFAULT_CLI_BODY_LIMIT, DEFAULT_CLI_PROXY_LISTEN, DEFAULT_FORWARDER_LISTEN } from './defaults.js';
import { addMetricsFlag } from './metrics-flag.js';
import { addServerOptions, layoutFrom, OptionErrors, positiveInt, serverOptions } from './options.js';
import { metricsTarget, str, type Opts } from './part-flags.js';


export function addForwarderFlags(cmd: Command): Command {
  return addServerOptions(
    addMetricsFlag(cmd)
      .option('--state-dir <dir>', 'state root (default: $STATE_DIRECTORY, /var/lib/agent-connectors as root, else XDG state)')
      .option('--instances <file>', 'binding registry (default: <state>/mcp-forwarder/instances.json)'),
    { listen: DEFAULT_FORWARDER_LISTEN, bodyLimit: DEFAULT_BODY_LIMIT },
  );
}

export function forwarderPartsFrom(opts: Opts): PartsConfig {
  const errors = new OptionErrors();
  const config: PartsConfig = {
    forwarder: { ...serverOptions(opts, errors), instancesPath: layoutFrom(opts).instances },
    metrics: metricsTarget(opts, errors),
  };
  errors.done();
  return config;
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** A repeatable option's values (commander gives an array; `Opts` is typed for single values). */
function list(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : typeof value === 'string' ? [value] : [];
}

export function addCliProxyFlags(cmd: Command): Command {
  return addServerOptions(
    addMetricsFlag(cmd)
      .option('--state-dir <dir>', 'state root')
      .option('--providers <file>', 'provider catalog (default: <state>/cli-proxy/providers.json)')
      .option('--audit-dir <dir>', 'spool of native_cli audit events, uploaded by the link (default: <state>/audit)')
      .option('--audit-max-events <n>', 'spool bound: past it the oldest events are dropped and counted', String(DEFAULT_AUDIT_MAX_EVENTS))
      .option('--no-audit', 'write no audit events')
      .option('--ca-bundle <file>', `the shims' CA bundle, written at start (default: ${SYSTEM_CA_BUNDLE_DIR}/${CA_BUNDLE_FILE} for the system state root, else <state>/ca-bundle/${CA_BUNDLE_FILE})`)
      .option('--resolve <host:port:addr>', 'test aid: send a host\'s upstream connections (TLS mode, base-url https upstreams) to ADDR (curl\'s syntax; ADDR may carry :PORT); repeatable', collect, [])
      .option('--upstream-ca <file>', 'test aid: a CA https upstream certificates may also chain to (TLS mode, base-url https upstreams); repeatable', collect, []),
    { listen: DEFAULT_CLI_PROXY_LISTEN, bodyLimit: DEFAULT_CLI_BODY_LIMIT },
  );
}

export function cliProxyPartsFrom(opts: Opts): PartsConfig {
  const errors = new OptionErrors();
  const layout = layoutFrom(opts);
  const config: PartsConfig = {
    cliProxy: {
      ...serverOptions(opts, errors),
      providersPath: layout.providers,
      audit:
        opts.audit === false
          ? undefined
          : {
              dir: str(opts.auditDir) ? resolve(str(opts.auditDir) as string) : layout.audit,
              maxEvents: errors.parse(positiveInt, opts.auditMaxEvents, '--audit-max-events', DEFAULT_AUDIT_MAX_EVENTS),
            },
      tls: {
        ca: { dir: layout.cliCa, bundle: str(opts.caBundle) ? resolve(str(opts.caBundle) as string) : defaultCaBundle(layout.root) },
        resolve: errors.attempt(() => parseResolve(list(opts.resolve)), new Map()),
        upstreamCaFiles: list(opts.upstreamCa).map((f) => resolve(f)),
      },
    },
    metrics: metricsTarget(opts, errors),
  };
  errors.done();
  return config;
}

