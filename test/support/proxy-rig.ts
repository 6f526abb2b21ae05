import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { CliProc, startCli, writeJsonAtomic, writeToken, type LogLine } from './cli-proc.js';
import { MockGateway } from './mock-gateway.js';
import type { TapTest } from './tap.js';
import { tempDir } from './temp-dir.js';

/*
 * The one way tests start a proxy process: the built CLI's `forwarder` or `cli-proxy` on
 * an ephemeral loopback port, its state in a temp dir, at trace level (so the leak check
 * sees every line it can print), killed at the end of the test that started it.
 */

export type ProxyKind = 'forwarder' | 'cli-proxy';

/** What differs between the two parts: where their config lives and what they log. */
const PARTS: Record<ProxyKind, { dir: string; config: string; loaded: (l: LogLine, n: number) => boolean }> = {
  forwarder: { dir: 'mcp-forwarder', config: 'instances.json', loaded: (l, n) => l.msg === 'registry loaded' && l.instances === n },
  'cli-proxy': { dir: 'cli-proxy', config: 'providers.json', loaded: (l, n) => l.msg === 'catalog loaded' && l.providers === n },
};

/** A running forwarder or cli-proxy. */
export interface ProxyProc extends CliProc {
  kind: ProxyKind;
  port: number;
  /** `http://127.0.0.1:<port>` */
  base: string;
  stateDir: string;
  /** `<state>/mcp-forwarder` or `<state>/cli-proxy` (0700): config and token files. */
  dir: string;
  /** instances.json or providers.json in `dir`. */
  configPath: string;
}

export interface ProxyOptions {
  stateDir?: string;
  /** Extra CLI arguments (`--allowed-uids`, `--body-limit-bytes`, …). */
  args?: string[];
  env?: NodeJS.ProcessEnv;
  /** Registry or catalog, written into place before the process starts. */
  config?: unknown;
}

/** `<state>/<part dir>`, created 0700 like the service's own state directory. */
export function partDir(stateDir: string, kind: ProxyKind): string {
  const dir = join(stateDir, PARTS[kind].dir);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** Starts a proxy process and waits until it listens; a start-up death fails at once, with its output. */
export async function startProxy(t: TapTest, kind: ProxyKind, opts: ProxyOptions = {}): Promise<ProxyProc> {
  const stateDir = opts.stateDir ?? tempDir(`ac-${kind}-`);
  const dir = partDir(stateDir, kind);
  const configPath = join(dir, PARTS[kind].config);
  if (opts.config !== undefined) writeJsonAtomic(configPath, opts.config);
  const proc = startCli([kind, '--listen', '127.0.0.1:0', '--state-dir', stateDir, '--log-level', 'trace', ...(opts.args ?? [])], opts.env);
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  const died = proc.exited.then(({ code, signal }) => {
    throw new Error(`${kind} exited (${code ?? signal}) before listening:\n${proc.lines.slice(-20).join('\n')}`);
  });
  died.catch(() => undefined);
  // A deadline, not a timing check: on a loaded 2-core machine a start took over 20 s (load 12).
  const line = await Promise.race([proc.waitForLog((l) => l.msg === `${kind} listening`, 60_000), died]);
  const port = line.port as number;
  return Object.assign(proc, { kind, port, base: `http://127.0.0.1:${port}`, stateDir, dir, configPath });
}

/** Writes the registry/catalog into place (by default where the process reads it) and waits until it is loaded. */
export async function loadConfig(proc: ProxyProc, value: Record<string, unknown>, path = proc.configPath): Promise<void> {
  const mark = proc.logs.length;
  writeJsonAtomic(path, value);
  await proc.waitForLog((l) => PARTS[proc.kind].loaded(l, Object.keys(value).length), 10_000, mark);
}

/** Anything a proxy can forward to that the rig can close: MockGateway, McpUpstream. */
export interface Upstream {
  url(path?: string): string;
  close(): Promise<void>;
}

export interface RigOptions<U extends Upstream> extends Omit<ProxyOptions, 'config'> {
  /** Starts the upstream, closed at teardown (default: a MockGateway); or one the caller started and closes. */
  upstream?: U | (() => Promise<U>);
  /** Token files to write into the part's dir before start: file name → token. */
  tokens?: Record<string, string>;
  /** The registry/catalog, given the upstream and the part's dir; the rig waits until it is in force. */
  config?: (upstream: U, dir: string) => Record<string, unknown>;
}

export interface Rig<U extends Upstream> {
  upstream: U;
  proc: ProxyProc;
  /** `<part dir>/<name>`: where `tokens` were written. */
  tokenFile: (name: string) => string;
}

/** An upstream, then a proxy process whose config points at it (every part in a temp state dir). */
export async function startRig<U extends Upstream = MockGateway>(t: TapTest, kind: ProxyKind, opts: RigOptions<U> = {}): Promise<Rig<U>> {
  let upstream: U;
  if (opts.upstream !== undefined && typeof opts.upstream !== 'function') {
    upstream = opts.upstream;
  } else {
    const start = opts.upstream ?? ((() => MockGateway.start()) as unknown as () => Promise<U>);
    const started = await start();
    t.teardown(() => started.close());
    upstream = started;
  }
  const stateDir = opts.stateDir ?? tempDir(`ac-${kind}-`);
  const dir = partDir(stateDir, kind);
  for (const [name, token] of Object.entries(opts.tokens ?? {})) writeToken(join(dir, name), token);
  const config = opts.config?.(upstream, dir);
  const proc = await startProxy(t, kind, { stateDir, args: opts.args ?? [], env: opts.env ?? {}, config });
  if (config !== undefined) await proc.waitForLog((l) => PARTS[kind].loaded(l, Object.keys(config).length));
  return { upstream, proc, tokenFile: (name) => join(dir, name) };
}

/** The registry entry of one binding to `upstreamUrl`, token file `<dir>/<instanceId>.token`. */
export function binding(dir: string, instanceId: string, upstreamUrl: string): { instanceId: string; upstreamUrl: string; tokenFile: string } {
  return { instanceId, upstreamUrl, tokenFile: join(dir, `${instanceId}.token`) };
}

/** A forwarder with one binding to a MockGateway: what most forwarder tests need. */
export async function forwarderRig(
  t: TapTest,
  opts: { binding: string; token?: string; args?: string[]; upstreamUrl?: (gw: MockGateway) => string; gw?: MockGateway },
): Promise<{ gw: MockGateway; fwd: ProxyProc; url: string; tokenFile: string }> {
  const instanceId = `inst-${opts.binding}`;
  const rig = await startRig<MockGateway>(t, 'forwarder', {
    ...(opts.gw ? { upstream: opts.gw } : {}),
    args: opts.args ?? [],
    tokens: opts.token === undefined ? {} : { [`${instanceId}.token`]: opts.token },
    config: (gw, dir) => ({ [opts.binding]: binding(dir, instanceId, opts.upstreamUrl ? opts.upstreamUrl(gw) : gw.url()) }),
  });
  return { gw: rig.upstream, fwd: rig.proc, url: `${rig.proc.base}/i/${opts.binding}/mcp`, tokenFile: rig.tokenFile(`${instanceId}.token`) };
}
