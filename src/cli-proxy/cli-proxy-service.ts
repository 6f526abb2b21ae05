import type { UpstreamOptions } from '../http/upstream-agent.js';
import type { AuditMetrics } from '../metrics/audit-metrics.js';
import { createLoopbackService, type PartObserver } from '../http/loopback-service.js';
import type { PeerLimitFlags } from '../http/peer-limits.js';
import type { ListenAddress } from '../http/loopback.js';
import type { Service } from '../service/service.js';
import { parseCatalog, providerPorts, type Catalog } from '../data/catalog.js';
import { DEFAULT_TOKEN_WAIT_MS, TokenRotationWait } from '../token/token-wait.js';
import { readFile } from 'node:fs/promises';
import type { Socket } from 'node:net';
import type { Agent } from 'undici';
import type { HotFile } from '../config/hot-file.js';
import { createLoopbackServer } from '../http/server.js';
import type { LoopbackServiceSpec } from '../http/loopback-service.js';
import type { PipelineDeps } from '../http/request-pipeline.js';
import { AuditSpool, type AuditSpoolConfig } from './audit-spool.js';
import { openCliCa, systemCaText, type CliCaPaths } from './cli-ca.js';
import { createConnectHandler } from './connect.js';
import { createCliProxyHandler, createInterceptHandler, type CliProxyDeps } from './handler.js';
import { LeafCache, type LeafCacheOptions } from './leaf-cache.js';
import { createTlsUpstreamAgent, type ResolveMap } from './tls-upstream.js';

export interface CliProxyConfig {
  listen: ListenAddress;
  providersPath: string;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  allowedUids?: ReadonlySet<number> | undefined;
  /** Only its users (and root, the service user) may connect; see PeerAccess. */
  agentUsersFile?: string | undefined;
  /** After an upstream 401, how long a request waits for a renewed token (default 5 s). */
  tokenWaitMs?: number;
  /** The audit spool (SPEC §9); undefined: no audit events. */
  audit?: AuditSpoolConfig | undefined;
  /** Its metrics, when `--metrics-listen` is on. */
  observer?: PartObserver | undefined;
  /** The audit spool's metrics, when `--metrics-listen` and the audit are on. */
  auditMetrics?: AuditMetrics | undefined;
  /** TLS mode (SPEC §10): the CLI CA and the test aids; undefined: CONNECT is refused (405). */
  tls?: CliProxyTlsConfig | undefined;
  /** Per-UID and process limits given as flags (src/http/peer-limits.ts). */
  limits?: PeerLimitFlags | undefined;
}

export interface CliProxyTlsConfig {
  ca: CliCaPaths;
  /** `--resolve`: test aid (TLS mode's hosts and base-url providers' https upstreams). */
  resolve: ResolveMap;
  /** `--upstream-ca` files: test aid, CAs upstream certificates may also chain to (both modes, https). */
  upstreamCaFiles: readonly string[];
  leaves?: LeafCacheOptions;
}

/** What TLS mode holds while the proxy runs. */
interface TlsRuntime {
  leaves: LeafCache;
  agent: Agent;
}

/** The cli-proxy as a Service: catalog → route → inject → dispatch → stream. */
export function createCliProxyService(deps: { config: CliProxyConfig; onListening?: (port: number) => void }): Service {
  const { config } = deps;
  // One for both listeners' requests: one watch per token file in rotation.
  const rotation = new TokenRotationWait();
  const { audit, tls: tlsConfig } = config;
  const handlerDeps = (d: PipelineDeps & { config: HotFile<Catalog>; agent: Agent }): CliProxyDeps => ({
    ...d,
    catalog: d.config,
    bodyLimit: config.bodyLimit,
    tokenWaitMs: config.tokenWaitMs ?? DEFAULT_TOKEN_WAIT_MS,
    rotation,
    audit: spool,
    tlsAgent: tls?.agent,
    labAgent: tlsConfig && (tlsConfig.resolve.size > 0 || tlsConfig.upstreamCaFiles.length > 0) ? tls?.agent : undefined,
  });
  let spool: AuditSpool | undefined;
  let tls: TlsRuntime | undefined;
  const proxy = createLoopbackService<Catalog>({
    name: 'cli-proxy',
    listen: config.listen,
    upstream: config.upstream,
    shutdownGraceMs: config.shutdownGraceMs,
    config: { path: config.providersPath, parse: parseCatalog, empty: {}, label: 'catalog', countField: 'providers', noun: 'provider' },
    handler: (d) => createCliProxyHandler(handlerDeps(d)),
    // Provider ports (SPEC §10): always on the IPv4 loopback, where the shims' {baseUrl} points.
    sidePorts: { host: '127.0.0.1', ports: (catalog) => new Set(providerPorts(catalog).keys()) },
    connect: tlsConfig ? (d) => tlsConnect(d, handlerDeps(d), tlsConfig.resolve, () => tls) : undefined,
    onListening: deps.onListening,
    allowedUids: config.allowedUids,
    agentUsersFile: config.agentUsersFile,
    peerUids: config.audit !== undefined,
    observer: config.observer,
    limits: config.limits,
  });
  if (!audit && !tlsConfig) return proxy;
  return {
    name: proxy.name,
    async run(ctx) {
      if (tlsConfig) {
        // Before listening: a CLI CA that cannot be made or read stops the start, with the path.
        const ca = await openCliCa(tlsConfig.ca, ctx.log);
        const extra = await Promise.all(tlsConfig.upstreamCaFiles.map((f) => readFile(f, 'utf8')));
        const trust = [await systemCaText(), ...extra].join('\n');
        tls = { leaves: new LeafCache(ca, tlsConfig.leaves), agent: createTlsUpstreamAgent(config.upstream, trust, tlsConfig.resolve) };
        ctx.log.info({ caDir: tlsConfig.ca.dir, bundle: tlsConfig.ca.bundle, resolve: tlsConfig.resolve.size, upstreamCa: extra.length }, 'TLS mode ready');
      }
      if (audit) {
        spool = new AuditSpool(audit, ctx.log.child({ audit: true }));
        await spool.open();
        config.auditMetrics?.watch(spool);
      }
      try {
        await proxy.run(ctx);
      } finally {
        // The drained requests' events are queued behind the last response: write them before exit.
        await spool?.flush();
        await tls?.agent.close().catch(() => undefined);
      }
    },
  };
}

type ConnectDepsOf = Parameters<NonNullable<LoopbackServiceSpec<Catalog>['connect']>>[0];

/**
 * CONNECT: intercepted connections are served by a second HTTP server that never
 * listens; each decrypted connection is handed to it with the tunnel's host and the outer
 * connection's peer, so its requests are checked, audited and counted like `/p/` ones.
 */
function tlsConnect(d: ConnectDepsOf, handlerDeps: CliProxyDeps, resolve: ResolveMap, runtime: () => TlsRuntime | undefined): ReturnType<NonNullable<LoopbackServiceSpec<Catalog>['connect']>> {
  const rt = runtime();
  if (!rt) throw new Error('TLS mode started without its CA');
  const hosts = new WeakMap<Socket, string>();
  const inner = createLoopbackServer(createInterceptHandler(handlerDeps, (req) => hosts.get(req.socket)));
  return createConnectHandler({
    catalog: d.config,
    log: d.log,
    leaves: rt.leaves,
    peerAllowed: d.socketAllowed,
    stopping: d.stopping,
    resolve,
    intercept: (tlsSocket, outer, host) => {
      hosts.set(tlsSocket, host);
      d.adopt(tlsSocket, outer);
      inner.emit('connection', tlsSocket);
    },
  });
}
