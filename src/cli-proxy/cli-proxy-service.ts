import type { UpstreamOptions } from '../http/upstream-agent.js';
import { createLoopbackService, type PartObserver } from '../http/loopback-service.js';
import type { PeerLimitFlags } from '../http/peer-limits.js';
import type { ListenAddress } from '../http/loopback.js';
import type { Service } from '../service/service.js';
import { parseCatalog, type Catalog } from '../data/catalog.js';
import { DEFAULT_TOKEN_WAIT_MS, TokenRotationWait } from '../token/token-wait.js';
import { AuditSpool, type AuditSpoolConfig } from './audit-spool.js';
import { createCliProxyHandler } from './handler.js';

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
  /** Per-UID and process limits given as flags (src/http/peer-limits.ts). */
  limits?: PeerLimitFlags | undefined;
}

/** The cli-proxy as a Service: catalog → route → inject → dispatch → stream. */
export function createCliProxyService(deps: { config: CliProxyConfig; onListening?: (port: number) => void }): Service {
  const { config } = deps;
  let spool: AuditSpool | undefined;
  const proxy = createLoopbackService<Catalog>({
    name: 'cli-proxy',
    listen: config.listen,
    upstream: config.upstream,
    shutdownGraceMs: config.shutdownGraceMs,
    config: { path: config.providersPath, parse: parseCatalog, empty: {}, label: 'catalog', countField: 'providers', noun: 'provider' },
    handler: (d) =>
      createCliProxyHandler({
        ...d,
        catalog: d.config,
        bodyLimit: config.bodyLimit,
        tokenWaitMs: config.tokenWaitMs ?? DEFAULT_TOKEN_WAIT_MS,
        rotation: new TokenRotationWait(),
        audit: spool,
      }),
    onListening: deps.onListening,
    allowedUids: config.allowedUids,
    agentUsersFile: config.agentUsersFile,
    peerUids: config.audit !== undefined,
    observer: config.observer,
    limits: config.limits,
  });
  const audit = config.audit;
  if (!audit) return proxy;
  return {
    name: proxy.name,
    async run(ctx) {
      spool = new AuditSpool(audit, ctx.log.child({ audit: true }));
      await spool.open();
      try {
        await proxy.run(ctx);
      } finally {
        // The drained requests' events are queued behind the last response: write them before exit.
        await spool.flush();
      }
    },
  };
}
