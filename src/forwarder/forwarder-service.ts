import type { UpstreamOptions } from '../http/dispatch.js';
import { createLoopbackService } from '../http/loopback-service.js';
import type { ListenAddress } from '../http/loopback.js';
import { parseInstancesFile, type InstancesFile } from '../registry/schema.js';
import type { Service } from '../service/service.js';
import { createForwarderHandler } from './handler.js';

export interface ForwarderConfig {
  listen: ListenAddress;
  instancesPath: string;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  allowedUids?: ReadonlySet<number> | undefined;
}

export interface ForwarderDepsIn {
  config: ForwarderConfig;
  /** Called once listening, with the bound port (tests and `dev` use port 0). */
  onListening?: (port: number) => void;
}

/** The Forwarder as a Service: registry → route → token → dispatch → stream. */
export function createForwarderService(deps: ForwarderDepsIn): Service {
  const { config } = deps;
  return createLoopbackService<InstancesFile>({
    name: 'forwarder',
    listen: config.listen,
    upstream: config.upstream,
    shutdownGraceMs: config.shutdownGraceMs,
    config: { path: config.instancesPath, parse: parseInstancesFile, empty: {}, label: 'registry', countField: 'instances', noun: 'instance' },
    handler: (d) => createForwarderHandler({ ...d, registry: d.config, bodyLimit: config.bodyLimit }),
    onListening: deps.onListening,
    allowedUids: config.allowedUids,
  });
}
