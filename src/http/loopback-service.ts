import { mkdir } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
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
import type { Admission, KnownPeer, PipelineDeps, RequestObserver } from './request-pipeline.js';
import { closeGracefully, createLoopbackServer, InFlight, listen, refuseConnection } from './server.js';
import { PeerLimits, resolvePeerLimits, UNKNOWN_PEER, type PeerLimitFlags } from './peer-limits.js';
import { SideListeners } from './side-listeners.js';
import type { AppError } from '../errors.js';

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
  /** `sidePort`: the side port (below) a request's connection came in on; undefined for the main listener. */
  handler: (deps: PipelineDeps & { config: HotFile<T>; agent: Agent; sidePort: (socket: Socket) => number | undefined }) => (req: IncomingMessage, res: ServerResponse) => void;
  /**
   * More loopback ports on `host`, following the config (the cli-proxy's provider ports,
   * SPEC §10): their connections go through this part's one server, limits and peer check.
   */
  sidePorts?: { host: string; ports: (value: T) => ReadonlySet<number> } | undefined;
  /**
   * CONNECT (the cli-proxy's TLS mode, SPEC §10); without it CONNECT is answered 405.
   * `socketAllowed` is the peer check of a raw connection (undefined: none configured);
   * `adopt` gives a connection made on top of another (TLS inside a tunnel) its peer.
   */
  connect?: (deps: PipelineDeps & { config: HotFile<T>; agent: Agent; socketAllowed: ((socket: Socket) => Promise<boolean>) | undefined; adopt: (inner: Socket, outer: Socket) => void }) => {
    handle: (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
    closeAll: () => number;
  };
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
  /** Per-UID and process limits given as flags; the rest from the descriptor limit (peer-limits.ts). */
  limits?: PeerLimitFlags | undefined;
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
      // Set once the part listens: what follows each good load (the side ports).
      let afterGoodLoad: ((value: T) => void) | undefined;
      const config: HotFile<T> = new HotFile<T>({
        ...spec.config,
        onLoad: (state, change) => {
          if (change.ok) afterGoodLoad?.(state.value);
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
        await serve(spec, { signal, log, notifier, onReload, config, agent, cleanups, self, lookups: lookups.get, afterGoodLoad: (fn) => (afterGoodLoad = fn) });
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
  afterGoodLoad: (fn: (value: T) => void) => void;
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
  // Both answers once in, set after the limits have counted the connection (and refused it
  // if over): a request that finds it needs to wait for nothing.
  const known = new WeakMap<Socket, KnownPeer>();
  const peerKnown = readUids ? (req: IncomingMessage): KnownPeer | undefined => known.get(req.socket) : undefined;
  const own = process.getuid?.();
  const resolved = resolvePeerLimits(spec.limits ?? {});
  const limits = new PeerLimits(resolved, new Set([0, ...(own === undefined ? [] : [own])]));
  // Per-UID limits need the peer's UID: read wherever a peer check or the audit reads it (always in the units).
  log.info({ ...resolved, perUid: readUids }, 'connection limits');
  // A flood is logged once per episode (per UID), not once per connection refused.
  const warned = new Set<number | 'process'>();
  const refused = new WeakSet<Socket>();
  const refuse = (socket: Socket, err: AppError): void => {
    refused.add(socket);
    if (!socket.destroyed) refuseConnection(socket, err);
  };
  const admitByUid = async (req: IncomingMessage, res: ServerResponse): Promise<Admission> => {
    const uid = (await uidOf.get(req.socket)) ?? UNKNOWN_PEER;
    // Refused meanwhile: the UID's connection count, known only now.
    if (refused.has(req.socket)) return 'answered';
    return limits.request(uid, res);
  };
  // Synchronous where nothing is to be waited for (no per-UID limits without the peer's UID).
  const admit = (req: IncomingMessage, res: ServerResponse): Admission | Promise<Admission> => {
    if (refused.has(req.socket)) return 'answered';
    if (!readUids) return undefined;
    const peer = known.get(req.socket);
    return peer ? limits.request(peer.uid ?? UNKNOWN_PEER, res) : admitByUid(req, res);
  };
  // Created before the server so the handler can ask it; it binds only once the main port is up.
  let side: SideListeners | undefined;
  const sidePort = (socket: Socket): number | undefined => side?.portOf(socket);
  const deps = { config, agent: r.agent, log, inflight, port: () => self.port, stopping: () => stopping, peerAllowed, peerUid: peerUidOf, peerKnown, observer: spec.observer, admit };
  const server = createLoopbackServer(spec.handler({ ...deps, sidePort }));
  const tunnels = spec.connect?.({
    ...deps,
    socketAllowed: checked ? (socket) => allowed.get(socket) ?? Promise.resolve(false) : undefined,
    adopt: (inner, outer) => {
      const decision = allowed.get(outer);
      if (decision) allowed.set(inner, decision);
      const uid = uidOf.get(outer);
      if (uid) uidOf.set(inner, uid);
      const peer = known.get(outer);
      if (peer) known.set(inner, peer);
    },
  });
  if (tunnels) {
    server.removeAllListeners('connect');
    server.on('connect', tunnels.handle);
  }
  // Registered before the peer check's, so a connection past the process's limit is never looked up.
  server.on('connection', (socket: Socket) => {
    const gate = limits.accept(socket);
    if (gate === undefined) warned.delete('process');
    else if (!warned.has('process')) {
      warned.add('process');
      log.warn({ open: limits.open, maxConnections: resolved.maxConnections }, 'connection refused: the process is at its connection limit (503 overloaded)');
    }
    if (gate === 'drop') socket.destroy();
    else if (gate) refuse(socket, gate);
  });
  let access: PeerAccess | undefined;
  if (checked) {
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
      if (refused.has(socket) || socket.destroyed) return;
      const uid = lookup(socket.remoteAddress ?? '', socket.remotePort ?? 0, socket.localAddress ?? '', socket.localPort ?? 0);
      uidOf.set(socket, uid);
      void uid.then((u) => {
        const key = u ?? UNKNOWN_PEER;
        const gate = limits.connected(socket, key);
        if (!gate) warned.delete(key);
        else if (!refused.has(socket)) {
          if (!warned.has(key)) log.warn({ uid: u ?? null, connectionsPerUid: resolved.connectionsPerUid }, 'connection refused: its UID has too many open (429 too_many_connections)');
          warned.add(key);
          refuse(socket, gate);
        }
        if (!peers) known.set(socket, { allowed: true, uid: u });
      });
      if (!peers) return;
      const decision = uid.then(async (uid) => {
        const ok = uid !== undefined && (await peers.allows(uid));
        // A client already gone has no entry left to find; nothing to refuse or report.
        if (!ok && !socket.destroyed && !(uid === undefined && self.overloaded)) log.warn({ uid: uid ?? null }, 'connection from a UID not allowed (agent users, --allowed-uids)');
        known.set(socket, { allowed: ok, uid });
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
  if (spec.sidePorts) {
    const { host, ports } = spec.sidePorts;
    const listeners = new SideListeners(host, (socket) => server.emit('connection', socket), log);
    side = listeners;
    r.cleanups.push(() => listeners.close());
    r.afterGoodLoad((value) => void listeners.sync(ports(value)));
    await listeners.sync(ports(config.current.value));
  }
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
  await side?.close();
  log.info({ inflight: inflight.size, graceMs: spec.shutdownGraceMs }, `${spec.name} draining`);
  const { clean, streamsCut } = await closeGracefully(server, inflight, spec.shutdownGraceMs, () => tunnels?.closeAll());
  log.info({ clean, streamsCut }, `${spec.name} stopped`);
}

/** What systemd shows for the unit (STATUS=): what is served, and whether from the last good file. */
function statusLine<T>(spec: LoopbackServiceSpec<T>, config: HotFile<T>): string {
  const s = config.current;
  const served = `${Object.keys(s.value as object).length} ${spec.config.noun}(s)`;
  return s.status === 'ok' ? `serving ${served}` : `degraded: ${basename(spec.config.path)} invalid, serving last good ${served}`;
}
