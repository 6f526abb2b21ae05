import type { UpstreamOptions } from '../http/upstream-agent.js';
import { createLoopbackService, type PartObserver } from '../http/loopback-service.js';
import type { ListenAddress } from '../http/loopback.js';
import type { Service } from '../service/service.js';
import { parseCatalog, type Catalog } from '../data/catalog.js';
import { DEFAULT_TOKEN_WAIT_MS, TokenRotationWait } from '../token/token-wait.js';
import { createCliProxyHandler } from './handler.js';

export interface CliProxyConfig {
  listen: ListenAddress;
  providersPath: string;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  allowedUids?: ReadonlySet<number> | undefined;
  /** After an upstream 401, how long a request waits for a renewed token (default 5 s). */
  tokenWaitMs?: number;
  /** Its metrics, when `--metrics-listen` is on. */
  observer?: PartObserver | undefined;
}

/** The cli-proxy as a Service: catalog → route → inject → dispatch → stream. */
export function createCliProxyService(deps: { config: CliProxyConfig; onListening?: (port: number) => void }): Service {
  const { config } = deps;
  return createLoopbackService<Catalog>({
    name: 'cli-proxy',
    listen: config.listen,
    upstream: config.upstream,
    shutdownGraceMs: config.shutdownGraceMs,
    config: { path: config.providersPath, parse: parseCatalog, empty: {}, label: 'catalog', countField: 'providers', noun: 'provider' },
    handler: (d) =>
      createCliProxyHandler({ ...d, catalog: d.config, bodyLimit: config.bodyLimit, tokenWaitMs: config.tokenWaitMs ?? DEFAULT_TOKEN_WAIT_MS, rotation: new TokenRotationWait() }),
    onListening: deps.onListening,
    allowedUids: config.allowedUids,
    observer: config.observer,
  });
}
