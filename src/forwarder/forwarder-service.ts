import type { UpstreamOptions } from '../http/upstream-agent.js';
import { createLoopbackService, type PartObserver } from '../http/loopback-service.js';
import type { PeerLimitFlags } from '../http/peer-limits.js';
import type { ListenAddress } from '../http/loopback.js';
import { parseInstancesFile, type InstancesFile } from '../data/registry.js';
import type { Service } from '../service/service.js';
import { DEFAULT_TOKEN_WAIT_MS, TokenRotationWait } from '../token/token-wait.js';
import { createForwarderHandler } from './handler.js';

export interface ForwarderConfig {
  listen: ListenAddress;
  instancesPath: string;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  allowedUids?: ReadonlySet<number> | undefined;
  /** Only its users (and root, the service user) may connect; see PeerAccess. */
  agentUsersFile?: string | undefined;
  /** After an upstream 401, how long a request waits for a renewed token (default 5 s). */
  tokenWaitMs?: number;
  /** Its metrics, when `--metrics-listen` is on. */
  observer?: PartObserver | undefined;
  /** Per-UID and process limits given as flags (src/http/peer-limits.ts). */
  limits?: PeerLimitFlags | undefined;
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
    handler: (d) =>
      createForwarderHandler({ ...d, registry: d.config, bodyLimit: config.bodyLimit, tokenWaitMs: config.tokenWaitMs ?? DEFAULT_TOKEN_WAIT_MS, rotation: new TokenRotationWait() }),
    onListening: deps.onListening,
    allowedUids: config.allowedUids,
    agentUsersFile: config.agentUsersFile,
    observer: config.observer,
    limits: config.limits,
  });
}
