import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import { HotFile } from '../config/hot-file.js';
import { createUpstreamAgent, type UpstreamOptions } from '../http/dispatch.js';
import type { ListenAddress } from '../http/loopback.js';
import { closeGracefully, createLoopbackServer, InFlight, listen } from '../http/server.js';
import type { Logger } from '../log/logger.js';
import { parseInstancesFile, type InstancesFile } from '../registry/schema.js';
import type { Notifier } from '../service/sd-notify.js';
import type { Service } from '../service/service.js';
import { createForwarderHandler } from './handler.js';

export interface ForwarderConfig {
  listen: ListenAddress;
  instancesPath: string;
  bodyLimit: number;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
}

export interface ForwarderDepsIn {
  config: ForwarderConfig;
  log: Logger;
  notifier: Notifier;
  /** Called once listening, with the bound port (tests and `dev` use port 0). */
  onListening?: (port: number) => void;
}

function statusLine(registry: HotFile<InstancesFile>): string {
  const s = registry.current;
  const n = Object.keys(s.value).length;
  return s.status === 'ok' ? `serving ${n} instance(s)` : `degraded: instances.json invalid, serving last good ${n} instance(s)`;
}

/** The Forwarder as a Service: registry → route → token → dispatch → stream. */
export function createForwarderService(deps: ForwarderDepsIn): Service {
  const { config, log, notifier } = deps;
  return {
    name: 'forwarder',
    async run(signal) {
      await mkdir(dirname(config.instancesPath), { recursive: true, mode: 0o700 });
      const registry = new HotFile<InstancesFile>({
        path: config.instancesPath,
        parse: parseInstancesFile,
        empty: {},
        onLoad: (state, change) => {
          if (change.ok) {
            log.info({ instances: Object.keys(state.value).length, generation: state.generation, missing: change.missing }, 'registry loaded');
          } else {
            log.error({ error: state.error, instances: Object.keys(state.value).length }, 'registry rejected; keeping last good');
          }
          void notifier.status(statusLine(registry));
        },
      });
      await registry.start();

      const agent = createUpstreamAgent(config.upstream);
      const inflight = new InFlight();
      let stopping = false;
      let port = config.listen.port;
      const server = createLoopbackServer(
        createForwarderHandler({
          registry,
          agent,
          log,
          port: () => port,
          bodyLimit: config.bodyLimit,
          inflight,
          stopping: () => stopping,
        }),
      );
      // Node's own clientError handling answers 400/408/431 without detail; keep it.

      const bound = await listen(server, config.listen);
      port = bound.port;
      log.info({ address: bound.address, port: bound.port }, 'forwarder listening');
      deps.onListening?.(bound.port);

      const onHup = (): void => {
        log.info('SIGHUP: reloading registry');
        void (async () => {
          await notifier.reloading();
          await registry.reload();
          await notifier.ready(statusLine(registry));
        })();
      };
      process.on('SIGHUP', onHup);
      await notifier.ready(statusLine(registry));
      const stopWatchdog = notifier.startWatchdog();

      await new Promise<void>((resolve) => {
        if (signal.aborted) resolve();
        else signal.addEventListener('abort', () => resolve(), { once: true });
      });

      stopping = true;
      process.off('SIGHUP', onHup);
      stopWatchdog();
      await notifier.stopping();
      log.info({ inflight: inflight.size, graceMs: config.shutdownGraceMs }, 'forwarder draining');
      const clean = await closeGracefully(server, inflight, config.shutdownGraceMs);
      await agent.close().catch(() => undefined);
      await registry.close();
      log.info({ clean }, 'forwarder stopped');
    },
  };
}
