import { mkdir } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { PeerAccess } from './peer-access.js';
import { sharedPeerUidLookups, type PeerUidLookups } from './peer-uid.js';
import type { Agent } from 'undici';
import { HotFile, type HotFileOptions } from '../config/hot-file.js';
import { LINK_USER } from '../data/unit-names.js';
import type { Service, ServiceContext } from '../service/service.js';
import { hookEnabled } from '../service/test-hooks.js';
import { createUpstreamAgent, type UpstreamOptions } from './upstream-agent.js';
import { UpstreamGuard } from './upstream-guard.js';
import type { ListenAddress } from './loopback.js';
import type { PipelineDeps, RequestObserver } from './request-pipeline.js';
import { closeGracefully, createLoopbackServer, InFlight, listen } from './server.js';

export interface LoopbackServiceSpec<T> {
  /** Service name; also the log message prefix (`<name> listening`). */
  name: string;
  listen: ListenAddress;
  upstream: UpstreamOptions;
  shutdownGraceMs: number;
  /**
   * The hot-reloaded JSON config this part serves from (registry or catalog): `label`
   * names it in log lines, `countField` its entry count there, `noun` one entry in the
   * systemd status line.
   */
  config: Omit<HotFileOptions<T>, 'onLoad'> & { label: string; countField: string; noun: string };
  handler: (deps: PipelineDeps & { config: HotFile<T>; agent: Agent }) => (req: IncomingMessage, res: ServerResponse) => void;
  onListening?: (port: number) => void;
  /** Only these local UIDs may connect (the peer's UID is looked up once per connection). */
  allowedUids?: ReadonlySet<number> | undefined;
  /**
   * The agent-users file: its users may connect, and so may root, the service's own user
   * and the link's DynamicUser; a missing or empty file leaves only those (fail closed).
   */
  agentUsersFile?: string | undefined;
  /** Read each connection's peer UID even without `allowedUids` (the cli-proxy's audit names it). */
  peerUids?: boolean | undefined;
  /** The part's metrics (`--metrics-listen`): its requests and each load of its config file. */
  observer?: PartObserver | undefined;
}

export interface PartObserver extends RequestObserver {
  configLoaded(ok: boolean, entries: number): void;
}

/**
 * The one shape of a loopback proxy part (forwarder, cli-proxy): load and watch its config
 * file, listen, tell systemd, reload on the runner's reload (RELOADING=1 … READY=1), and on
 * stop drain in-flight requests within the grace period. Whatever it started is released
 * on every path: a listen that fails (EADDRINUSE) must leave nothing running, or the
 * config file's watcher would keep a process that serves nothing alive.
 */
export function createLoopbackService<T>(spec: LoopbackServiceSpec<T>): Service {
  return {
    name: spec.name,
    async run({ signal, log, notifier, onReload }) {
      await mkdir(dirname(spec.config.path), { recursive: true, mode: 0o700 });
      const config: HotFile<T> = new HotFile<T>({
        ...spec.config,
        onLoad: (state, change) => {
          const count = Object.keys(state.value as object).length;
          if (change.ok) {
            log.info({ [spec.config.countField]: count, generation: state.generation, missing: change.missing }, `${spec.config.label} loaded`);
          } else {
            log.error({ error: state.error, [spec.config.countField]: count }, `${spec.config.label} rejected; keeping last good`);
          }
          void notifier.status(statusLine(spec, config));
          spec.observer?.configLoaded(change.ok, count);
        },
      });
      const cleanups: Array<() => Promise<void> | void> = [];
      try {
        cleanups.push(() => config.close());
        await config.start();
        // During an overload episode its refusals are logged once, not once per connection.
        const self: SelfState = { port: spec.listen.port, access: undefined, overloaded: false };
        const lookups = sharedPeerUidLookups({
          onOverload: (e) => {
            self.overloaded = e.kind === 'saturated';
            if (e.kind === 'saturated') log.warn({ outstanding: e.outstanding }, 'peer check overloaded (the sock_diag helper is not answering): new connections are refused until it catches up');
            else log.info({ refused: e.refused }, 'peer check caught up; connections are checked again');
          },
        });
        cleanups.push(() => lookups.close());
        const guard = new UpstreamGuard({
          what: 'upstream',
          listenerOwner: async () => (await lookups.get()).listenerOwner,
          ownerUids: spec.upstream.loopbackOwnerUids,
          isAgent: (uid) => self.access?.isAgent(uid) ?? spec.allowedUids?.has(uid) ?? false,
          reservedPorts: () => [self.port, ...(spec.upstream.reservedPorts ?? [])],
          log,
        });
        const agent = createUpstreamAgent(spec.upstream, guard);
        cleanups.push(() => agent.close().catch(() => undefined));
        await serve(spec, { signal, log, notifier, onReload, config, agent, cleanups, self, lookups: lookups.get });
      } finally {
        for (const cleanup of cleanups.reverse()) await cleanup();
      }
    },
  };
}

/** What the upstream guard asks of the running part: its bound port, its agent users. */
interface SelfState {
  port: number;
  access: PeerAccess | undefined;
  overloaded: boolean;
}

interface Running<T> extends ServiceContext {
  config: HotFile<T>;
  agent: Agent;
  self: SelfState;
  lookups: () => Promise<PeerUidLookups>;
  /** Registered as each resource is taken, released in reverse by the caller. */
  cleanups: Array<() => Promise<void> | void>;
}

async function serve<T>(spec: LoopbackServiceSpec<T>, r: Running<T>): Promise<void> {
  const { log, notifier, config } = r;
  const inflight = new InFlight();
  let stopping = false;
  const { self } = r;
  const allowed = new WeakMap<Socket, Promise<boolean>>();
  const checked = spec.allowedUids !== undefined || spec.agentUsersFile !== undefined;
  const peerAllowed = checked ? (req: IncomingMessage): Promise<boolean> => allowed.get(req.socket) ?? Promise.resolve(false) : undefined;
  // The audit names each request's peer even where nobody is refused.
  const readUids = checked || spec.peerUids === true;
  const uidOf = new WeakMap<Socket, Promise<number | undefined>>();
  const peerUidOf = readUids ? (req: IncomingMessage): Promise<number | undefined> => uidOf.get(req.socket) ?? Promise.resolve(undefined) : undefined;
  const server = createLoopbackServer(
    spec.handler({ config, agent: r.agent, log, inflight, port: () => self.port, stopping: () => stopping, peerAllowed, peerUid: peerUidOf, observer: spec.observer }),
  );
  let access: PeerAccess | undefined;
  if (checked) {
    const own = process.getuid?.();
    access = new PeerAccess({
      always: spec.agentUsersFile !== undefined ? new Set([0, ...(own === undefined ? [] : [own])]) : new Set(),
      alwaysDynamic: spec.agentUsersFile !== undefined ? [LINK_USER] : [],
      fixed: spec.allowedUids,
      file: spec.agentUsersFile,
      log,
    });
    const peers = access;
    r.cleanups.push(() => peers.close());
    await peers.start();
    self.access = peers;
  }
  if (readUids) {
    const peers = access;
    const { lookup, method, skipped } = await r.lookups();
    if (method === 'sock_diag') log.info({ method }, 'peer check ready');
    else log.warn({ method, skipped: Object.values(skipped) }, 'peer check: the sock_diag helper (perl) is unusable; this fallback costs more per connection as the host\'s sockets grow');
    // Once per connection, not per request: keep-alive requests pay nothing.
    server.on('connection', (socket: Socket) => {
      const uid = lookup(socket.remoteAddress ?? '', socket.remotePort ?? 0, socket.localAddress ?? '', socket.localPort ?? 0);
      uidOf.set(socket, uid);
      if (!peers) return;
      const decision = uid.then(async (uid) => {
        const ok = uid !== undefined && (await peers.allows(uid));
        // A client already gone has no entry left to find; nothing to refuse or report.
        if (!ok && !socket.destroyed && !(uid === undefined && self.overloaded)) log.warn({ uid: uid ?? null }, 'connection from a UID not allowed (agent users, --allowed-uids)');
        return ok;
      });
      allowed.set(socket, decision);
    });
  }
  // Node's own clientError handling answers 400/408/431 without detail; keep it.
  const bound = await listen(server, spec.listen);
  // Normally closed by the drain below; this covers a failure between here and there.
  r.cleanups.push(() => {
    if (server.listening) server.close();
  });
  self.port = bound.port;
  log.info({ address: bound.address, port: bound.port }, `${spec.name} listening`);
  spec.onListening?.(bound.port);

  r.cleanups.push(
    r.onReload(() => {
      log.info(`SIGHUP: reloading ${spec.config.label}`);
      void (async () => {
        await notifier.reloading();
        await config.reload();
        await access?.reload();
        await notifier.ready(statusLine(spec, config));
      })();
    }),
  );
  // Test-only (AGENT_CONNECTORS_TEST_HOOKS=stall-on-sigusr2): SIGUSR2 blocks the event
  // loop for good, so the watchdog test sees systemd kill and restart a hung process.
  const onStall = (): void => {
    log.warn('test hook: stalling the event loop');
    for (;;) {
      // a hung process, on purpose
    }
  };
  if (hookEnabled('stall-on-sigusr2')) process.on('SIGUSR2', onStall);
  await notifier.ready(statusLine(spec, config));
  r.cleanups.push(notifier.startWatchdog());

  await new Promise<void>((resolve) => {
    if (r.signal.aborted) resolve();
    else r.signal.addEventListener('abort', () => resolve(), { once: true });
  });

  stopping = true;
  log.info({ inflight: inflight.size, graceMs: spec.shutdownGraceMs }, `${spec.name} draining`);
  const { clean, streamsCut } = await closeGracefully(server, inflight, spec.shutdownGraceMs);
  log.info({ clean, streamsCut }, `${spec.name} stopped`);
}

/** What systemd shows for the unit (STATUS=): what is served, and whether from the last good file. */
function statusLine<T>(spec: LoopbackServiceSpec<T>, config: HotFile<T>): string {
  const s = config.current;
  const served = `${Object.keys(s.value as object).length} ${spec.config.noun}(s)`;
  return s.status === 'ok' ? `serving ${served}` : `degraded: ${basename(spec.config.path)} invalid, serving last good ${served}`;
}
