import type { Registry } from 'prom-client';
import { createApplyService, type ApplyConfig } from '../apply/apply-service.js';
import type { CliProxyConfig } from '../cli-proxy/cli-proxy-service.js';
import { ConfigError } from '../errors.js';
import { createForwarderService, type ForwarderConfig } from '../forwarder/forwarder-service.js';
import type { ListenAddress } from '../http/loopback.js';
import { createLinkServices, type LinkConfig } from '../link/link.js';
import type { Logger } from '../log/logger.js';
import { createAuditMetrics } from '../metrics/audit-metrics.js';
import { createHttpMetrics } from '../metrics/http-metrics.js';
import { createLinkMetrics } from '../metrics/link-metrics.js';
import { mergedExposition, type Exposition } from '../metrics/merged-exposition.js';
import { createMetricsService } from '../metrics/metrics-service.js';
import { processRegistry } from '../metrics/process-metrics.js';
import { createRegistry, type Part } from '../metrics/registry.js';
import { createApplyMetrics, createRenewalMetrics } from '../metrics/renewal-metrics.js';
import { createNotifier, type Notifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { installShims } from '../shims/install.js';
import { ALLOWED_COMMANDS_FILE, readAllowedCommands } from '../data/allowed-commands.js';
import { PROVIDER_PORT_MAX, PROVIDER_PORT_MIN } from '../data/catalog.js';
import { DEFAULT_CLI_PROXY_LISTEN, DEFAULT_FORWARDER_LISTEN } from './defaults.js';
import { benchToggle } from './metrics-flag.js';

/** Where apply renders the desired state's shims, and the cli-proxy URL baked into them. */
export interface ShimTarget {
  dir: string;
  proxyUrl: string;
  /** The operator's allowed host tools (default /etc/agent-connectors/allowed-commands). */
  allowedCommandsFile?: string | undefined;
  /** The CA bundle TLS-mode shims name, where the cli-proxy writes it. */
  caBundle: string;
}

/**
 * The whole configuration of the parts one process runs, each part's typed config as its
 * module defines it (parsed from flags in part-configs.ts). A production command names one
 * part; `dev` names all four. Whatever a part observes or is told about another part is
 * wired here, not in the configs: metrics, the shims' proxy URL, presence's health URLs.
 */
export interface PartsConfig {
  forwarder?: Omit<ForwarderConfig, 'observer'> | undefined;
  cliProxy?: Omit<CliProxyConfig, 'observer' | 'auditMetrics'> | undefined;
  link?: LinkConfig | undefined;
  apply?: (Omit<ApplyConfig, 'metrics' | 'reconcile'> & { shims?: ShimTarget | undefined }) | undefined;
  /** One /metrics endpoint for the process, serving every part it runs; undefined: off. */
  metrics?: MetricsTarget | undefined;
}

export interface MetricsTarget {
  listen: ListenAddress;
  onListening?: ((port: number) => void) | undefined;
  /** Who may read them besides root and the service user (`--metrics-allowed-uids`). */
  allowedUids?: ReadonlySet<number> | undefined;
}

export interface PartHooks {
  /** A proxy is listening on this port (a configured port may be 0). */
  forwarderListening?: (port: number) => void;
  cliProxyListening?: (port: number) => void;
}

function hostForUrl(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

/** The base URL a part listening at `listen` answers on, once its port is known. */
export function loopbackBase(listen: ListenAddress, port: number): string {
  return `http://${hostForUrl(listen.host)}:${port}`;
}

/** The parts a config names, in the order their metrics registries are merged. */
function partsOf(config: PartsConfig): Part[] {
  const parts: Part[] = [];
  if (config.forwarder) parts.push('forwarder');
  if (config.cliProxy) parts.push('cli-proxy');
  if (config.link) parts.push('link');
  if (config.apply) parts.push('apply');
  return parts;
}

/**
 * A registry per part, each labelled with its part so a dashboard built on production's
 * one-part processes works on dev unchanged; with several parts in one process the process
 * series (CPU, memory, event loop) are that process's, counted once as part `dev`.
 */
function registriesFor(parts: readonly Part[]): { of: (part: Part) => Registry; exposition: Exposition } {
  const single = parts.length === 1;
  const registries = new Map(parts.map((p) => [p, createRegistry(p, { processMetrics: single })] as const));
  const all = [...registries.values()];
  const exposition = single ? (all[0] as Registry) : mergedExposition([...all, processRegistry('dev')]);
  return {
    of: (part) => {
      const r = registries.get(part);
      if (!r) throw new Error(`no metrics registry for part ${part}`);
      return r;
    },
    exposition,
  };
}

/**
 * Metrics get a port of their own: never one a part of this process listens on
 * (a scrape must never be taken for an agent's request).
 */
function checkMetricsPort(config: PartsConfig): void {
  const port = config.metrics?.listen.port;
  if (!port) return;
  for (const listen of [config.forwarder?.listen, config.cliProxy?.listen]) {
    if (listen && listen.port === port) throw new ConfigError(`--metrics-listen must not be the part's own port (${port}): metrics get a port of their own`);
  }
}

/** A `host:port` default's port. */
function portOf(hostPort: string): number {
  return Number(hostPort.slice(hostPort.lastIndexOf(':') + 1));
}

/**
 * This host's own listeners, as far as this process knows them: both proxies' default
 * ports (in production each runs in a process of its own, under one user, so the
 * owner check alone would not tell them from a real upstream), the configured ones and
 * the metrics port, the provider-port range. Ports picked by the kernel are added as they are bound, into the same
 * array the upstream guards read.
 */
function reservedPorts(config: PartsConfig): number[] {
  const ports = [portOf(DEFAULT_FORWARDER_LISTEN), portOf(DEFAULT_CLI_PROXY_LISTEN)];
  for (const listen of [config.forwarder?.listen, config.cliProxy?.listen, config.metrics?.listen]) if (listen?.port) ports.push(listen.port);
  // apply knows where the cli-proxy is from the URL it bakes into the shims.
  const shimProxy = config.apply?.shims?.proxyUrl;
  if (shimProxy) ports.push(Number(new URL(shimProxy).port || 80));
  // The cli-proxy's provider ports (SPEC §10): the whole documented range, whatever the catalog says now.
  for (let p = PROVIDER_PORT_MIN; p <= PROVIDER_PORT_MAX; p++) ports.push(p);
  return ports;
}

/**
 * The one wiring of the product: every command that runs a part, and `dev`, build their
 * services here, so `dev` is the production wiring plus the demo Gateway and nothing else.
 */
export async function buildParts(config: PartsConfig, log: Logger, hooks: PartHooks = {}): Promise<Service[]> {
  checkMetricsPort(config);
  // Loaded only where a cli-proxy runs: its TLS mode and SigV4 (pkijs, asn1js, @smithy)
  // added ~0.5 s of CPU (+40 %) to every other start (renew fetch, apply, forwarder),
  // seconds of wall time each on a loaded machine.
  const { createCliProxyService } = config.cliProxy ? await import('../cli-proxy/cli-proxy-service.js') : { createCliProxyService: undefined };
  const parts = partsOf(config);
  const metrics = config.metrics && registriesFor(parts);
  const services: Service[] = [];
  const reserved = reservedPorts(config);

  // Presence reports the health of the proxies; when they run in this process their real
  // ports (maybe picked by the kernel) replace the configured URLs as they listen.
  const health = config.link?.enrolled ? { ...config.link.enrolled.presence.health } : {};
  // Shims point at the cli-proxy: the one in this process once it listens, else the configured URL.
  let cliProxyUrl: Promise<string> | undefined;
  let cliProxyKnown: ((url: string) => void) | undefined;
  if (config.cliProxy) cliProxyUrl = new Promise((resolve) => (cliProxyKnown = resolve));

  if (config.apply) {
    const { shims, ...apply } = config.apply;
    services.push(
      createApplyService({
        ...apply,
        reconcile: shims && {
          allowedCommands: () => readAllowedCommands(shims.allowedCommandsFile ?? ALLOWED_COMMANDS_FILE),
          reservedPorts: reserved,
          renderShims: async (catalog) => {
            const proxyUrl = cliProxyUrl ? await cliProxyUrl : shims.proxyUrl;
            const r = await installShims(catalog, shims.dir, proxyUrl, shims.caBundle);
            log.info({ dir: shims.dir, written: r.written.length, changed: r.changed.length, removed: r.removed.length }, 'shims rendered');
          },
        },
        metrics: metrics && createApplyMetrics(metrics.of('apply')),
      }),
    );
  }
  if (config.link) {
    const link = config.link;
    const registry = metrics?.of('link');
    services.push(
      ...createLinkServices(
        {
          ...link,
          renewal: { ...link.renewal, metrics: registry && createRenewalMetrics(registry) },
          enrolled: link.enrolled && {
            ...link.enrolled,
            poller: { ...link.enrolled.poller, metrics: registry && createLinkMetrics(registry) },
            presence: { ...link.enrolled.presence, health },
          },
        },
        log,
      ),
    );
  }
  if (config.cliProxy && createCliProxyService) {
    const cliProxy = config.cliProxy;
    const registry = metrics?.of('cli-proxy');
    services.push(
      createCliProxyService({
        config: {
          ...cliProxy,
          upstream: { ...cliProxy.upstream, reservedPorts: reserved },
          observer: registry && createHttpMetrics(registry, 'providers.json'),
          // Without the audit there is no queue: no series, rather than one stuck at 0.
          auditMetrics: registry && cliProxy.audit && createAuditMetrics(registry),
        },
        onListening: (port) => {
          reserved.push(port);
          const base = loopbackBase(cliProxy.listen, port);
          health['cli-proxy'] = `${base}/healthz`;
          cliProxyKnown?.(base);
          hooks.cliProxyListening?.(port);
        },
      }),
    );
  }
  if (config.forwarder) {
    const forwarder = config.forwarder;
    services.push(
      createForwarderService({
        config: { ...forwarder, upstream: { ...forwarder.upstream, reservedPorts: reserved }, observer: metrics && benchToggle(createHttpMetrics(metrics.of('forwarder'), 'instances.json')) },
        onListening: (port) => {
          reserved.push(port);
          health.forwarder = `${loopbackBase(forwarder.listen, port)}/healthz`;
          hooks.forwarderListening?.(port);
        },
      }),
    );
  }
  if (config.metrics && metrics) {
    const onMetrics = config.metrics.onListening;
    services.push(
      createMetricsService({
        listen: config.metrics.listen,
        registry: metrics.exposition,
        allowedUids: config.metrics.allowedUids,
        onListening: (port) => {
          reserved.push(port);
          onMetrics?.(port);
        },
      }),
    );
  }
  return services;
}

/** A production command: its part(s), sd_notify to systemd, until SIGTERM. */
export async function runParts(config: PartsConfig, log: Logger, notifier: Notifier = createNotifier({ log })): Promise<void> {
  await runServices(await buildParts(config, log), { log, notifier });
}
