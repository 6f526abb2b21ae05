import type { UpstreamOptions } from '../http/dispatch.js';
import { createLoopbackService } from '../http/loopback-service.js';
import type { ListenAddress } from '../http/loopback.js';
import type { Service } from '../service/service.js';
import { parseCatalog, type Catalog } from './catalog.js';
import { createCliProxyHandler } from './handler.js';

export interface CliProxyConfig {
  listen: ListenAddress;
  providersPath: string;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  allowedUids?: ReadonlySet<number> | undefined;
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
    handler: (d) => createCliProxyHandler({ ...d, catalog: d.config, bodyLimit: config.bodyLimit }),
    onListening: deps.onListening,
    allowedUids: config.allowedUids,
  });
}
