import { hostname } from 'node:os';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { DEFAULT_AUDIT_MAX_EVENTS } from '../cli-proxy/audit-spool.js';
import { pathSetupCommand } from '../cli/cli-proxy-commands.js';
import { AGENTS, mcpAddCommand, mcpUrl } from '../cli/mcp-add.js';
import { handoffPaths } from '../data/handoff.js';
import { readInstances } from '../data/registry.js';
import { stateLayout, type StateLayout } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { parseListen, type ListenAddress } from '../http/loopback.js';
import { DEFAULT_BODY_LIMIT } from '../http/request-body.js';
import { defaultUpstreamOptions } from '../http/upstream-agent.js';
import { enroll, linkFiles, type Systemd } from '../link/enroll.js';
import { parseMetricsListen } from '../metrics/metrics-service.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { shQuote } from '../shims/render.js';
import { version } from '../version.js';
import { buildParts, loopbackBase, type PartsConfig } from '../wiring/build-parts.js';
import { DEFAULT_CLI_BODY_LIMIT, DEFAULT_CLI_PROXY_LISTEN, DEFAULT_FORWARDER_LISTEN } from '../wiring/defaults.js';
import { addMetricsFlag } from '../wiring/metrics-flag.js';
import { logLevelOption, loggerFrom, OptionErrors, parseOption, positiveInt } from '../wiring/options.js';
import { applyConfig } from '../wiring/apply-part.js';
import { linkConfig } from '../wiring/link-part.js';
import { changeDemoConnection, readDevRuntime, writeDevRuntime } from './demo-control-client.js';
import { RenewAuthority } from './demo-gateway/authority.js';
import { DEMO_PROVIDER, DemoConnections } from './demo-gateway/demo-control.js';
import { DemoGateway } from './demo-gateway/demo-gateway.js';
import { HostControl } from './demo-gateway/host-control.js';
import { demoKindSchema, demoNameSchema, type DemoKind } from './demo-wire.js';
import { createHostReport } from './host-report.js';

const DEFAULT_DEV_STATE = './.state';
/** The system state root: dev wipes its host state at start, so it never runs there. */
const SYSTEM_STATE_DIR = '/var/lib/agent-connectors';

/**
 * On by default in dev (it is for trying the product, and metrics are part of it), at a
 * fixed port so a local Prometheus keeps scraping across restarts.
 */
export const DEFAULT_DEV_METRICS_LISTEN = '127.0.0.1:14325';
/** Ctrl-C should not wait the production 10 s for a demo stream to finish. */
const DEV_SHUTDOWN_GRACE_MS = 2_000;

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Human lines for the person at the terminal (stderr: stdout carries the JSON log). */
function say(line: string): void {
  process.stderr.write(`${line}\n`);
}

/** dev runs the link in its own process: enroll must not touch a systemd unit of a real install. */
const NO_SYSTEMD: Systemd = {
  present: () => false,
  systemctl: async () => ({ exitCode: 1, stdout: '' }),
};

/** Puts the real `acdemo` command (a launcher for dist/dev/demo-cli.js) in <state>/demo-bin. */
async function installDemoCli(stateDir: string): Promise<string> {
  const dir = join(stateDir, 'demo-bin');
  await mkdir(dir, { recursive: true, mode: 0o755 });
  const script = fileURLToPath(new URL('./demo-cli.js', import.meta.url));
  await atomicWrite(join(dir, 'acdemo'), `#!/bin/sh\nexec ${shQuote(process.execPath)} ${shQuote(script)} "$@"\n`, { mode: 0o755 });
  return dir;
}

/**
 * The demo binding ids to keep (an agent configured once keeps working): from dev.json,
 * else from the registry an older dev left (it had the `demo` binding only).
 */
async function rememberedBindingIds(layout: StateLayout): Promise<Record<string, string>> {
  const runtime = await readDevRuntime(layout.root);
  if (runtime) return runtime.bindingIds;
  const instances = await readInstances(layout.instances).catch(() => ({}));
  const demo = Object.entries(instances).find(([, b]) => b.instanceId === 'demo')?.[0];
  return demo ? { demo } : {};
}

/**
 * The demo Gateway is new each run and forgets every host, slot and version: what an
 * earlier run enrolled, fetched, applied or was handed means nothing to it, so the host
 * starts afresh (as a newly installed host would) and enrols again.
 */
async function resetHostState(layout: StateLayout, credentialPath: string): Promise<void> {
  const files = linkFiles(credentialPath);
  for (const path of [files.credential, files.env, files.pending, layout.instances, layout.providers, layout.handoff, layout.linkPrivate]) {
    await rm(path, { recursive: true, force: true });
  }
  for (const dir of [layout.forwarderDir, layout.cliProxyDir]) {
    const names = await readdir(dir).catch(() => [] as string[]);
    for (const name of names.filter((n) => n.endsWith('.token'))) await rm(join(dir, name), { force: true });
  }
  const paths = handoffPaths(layout.handoff);
  for (const dir of [paths.root, paths.inbox, paths.slots]) await mkdir(dir, { recursive: true, mode: 0o700 });
}

/** How to run `dev connect` from where the user started dev. */
function controlCommand(stateDirFlag: string, words: string): string {
  const stateFlag = stateDirFlag === DEFAULT_DEV_STATE ? '' : ` --state-dir ${shQuote(stateDirFlag)}`;
  return process.env.npm_lifecycle_event === 'dev' ? `npm run dev -- ${words}${stateFlag}` : `agent-connectors dev ${words}${stateFlag}`;
}

/**
 * `dev`: a managed host (SPEC §8) and its platform in one process, no root, no systemd.
 * The demo Gateway (MCP server, renewal, host link, and the demo platform's page) starts
 * with the demo binding and provider connected; dev enrols against it with a pairing code
 * it prints (the `enroll` code path, the code never in argv), then runs the link
 * (renewals, state poll, presence), apply (reconcile), the forwarder and the cli-proxy.
 * Bindings and providers reach the host only through the desired state.
 */
async function runDev(opts: { stateDir: string; listen: string; cliListen: string; metricsListen: string; logLevel: string; tokenLifetimeS: string }): Promise<void> {
  // Every option parsed before anything starts, so a bad one is a usage error (exit 2).
  const errors = new OptionErrors();
  const listen = errors.attempt(() => parseListen(opts.listen), { host: '127.0.0.1', port: 0 });
  const cliListen = errors.attempt(() => parseListen(opts.cliListen, '--cli-listen'), { host: '127.0.0.1', port: 0 });
  const metricsListen = errors.attempt(() => parseMetricsListen(opts.metricsListen), undefined);
  const lifetimeMs = errors.parse(positiveInt, opts.tokenLifetimeS, '--token-lifetime-s', 60) * 1000;
  errors.done();
  const log = loggerFrom(opts);
  const stateDir = resolve(opts.stateDir);
  if (stateDir === SYSTEM_STATE_DIR) throw new ConfigError(`dev resets its host state at start: give it a state directory of its own, not ${SYSTEM_STATE_DIR}`);
  const layout = stateLayout(stateDir);
  await mkdir(stateDir, { recursive: true, mode: 0o700 });
  const credentialPath = join(stateDir, 'host-credential');
  const bindingIds = await rememberedBindingIds(layout);
  await resetHostState(layout, credentialPath);

  // HostControl installs its own validator: only enrolled hosts may renew.
  const authority = new RenewAuthority({ credential: () => false, tokenLifetimeMs: lifetimeMs, tokenPrefix: 'demo_' });
  const hostControl = new HostControl({
    authority,
    // What the platform would show for shell CLI calls (SPEC §9): one line per event.
    onAudit: (_host, events) => {
      for (const e of events) log.info({ part: 'demo-gateway', provider: e.provider, method: e.method, path: e.path, status: e.status, peerUid: e.peerUid }, 'audit event received');
    },
  });
  const gateway = new DemoGateway(log.child({ part: 'demo-gateway' }), authority, hostControl);
  const connections = new DemoConnections(hostControl, () => gateway.baseUrl, bindingIds);
  gateway.serveDemoControl(connections);
  await gateway.listen(0);
  // Whatever fails from here on (a port in use included), the demo Gateway must not
  // keep the process alive.
  try {
    // As if the user had connected these in the platform before adding this host.
    connections.change('connect', 'binding', 'demo');
    connections.change('connect', 'provider', DEMO_PROVIDER);
    log.info({ gateway: gateway.baseUrl, tokenLifetimeS: lifetimeMs / 1000 }, 'demo gateway up');
    const code = hostControl.issuePairingCode();
    say(`demo platform: ${gateway.baseUrl}/demo`);
    say(`pairing code ${code} (one-time, as the platform shows it when you add a host); enrolling with it`);
    const enrolled = await enroll({
      gatewayUrl: gateway.baseUrl,
      credentialPath,
      force: true,
      readCode: async () => code,
      hostname: hostname(),
      version,
      attempts: 3,
      systemd: NO_SYSTEMD,
      say: (line) => say(`enroll: ${line}`),
    });
    say('dev runs that link itself, with apply, the forwarder and the cli-proxy:');

    const demoBin = await installDemoCli(stateDir);
    const shimDir = layout.shims;
    const ports = { forwarder: deferred<number>(), cliProxy: deferred<number>(), metrics: deferred<number>() };
    const proxy = { upstream: defaultUpstreamOptions, shutdownGraceMs: DEV_SHUTDOWN_GRACE_MS };
    // The production wiring, every part of it, pointed at the demo Gateway.
    const parts: PartsConfig = {
      forwarder: { ...proxy, listen, instancesPath: layout.instances, bodyLimit: DEFAULT_BODY_LIMIT },
      cliProxy: { ...proxy, listen: cliListen, providersPath: layout.providers, bodyLimit: DEFAULT_CLI_BODY_LIMIT, audit: { dir: layout.audit, maxEvents: DEFAULT_AUDIT_MAX_EVENTS } },
      // A burst of demo CLI calls shows up in the demo Gateway's log within a second.
      link: linkConfig({ gatewayUrl: gateway.baseUrl, credentialPath, hostId: enrolled.hostId, layout }, { auditMinGapMs: 500 }),
      apply: applyConfig(layout, { dir: shimDir, proxyUrl: '' }),
      metrics: metricsListen && { listen: metricsListen, onListening: ports.metrics.resolve },
    };
    const base = (address: ListenAddress, port: Deferred<number>): Promise<string> => port.promise.then((p) => loopbackBase(address, p));
    const forwarderBase = base(listen, ports.forwarder);
    const cliProxyBase = base(cliListen, ports.cliProxy);
    let served: { forwarder?: string; cliProxy?: string } = {};
    void Promise.all([forwarderBase, cliProxyBase]).then(([f, c]) => (served = { forwarder: f, cliProxy: c }));

    const report = createHostReport({
      handoffDir: layout.handoff,
      instancesPath: layout.instances,
      providersPath: layout.providers,
      nameOf: (id) => connections.nameOf(id),
      forwarderBase: () => served.forwarder,
      cliProxyBase: () => served.cliProxy,
      say,
    });
    const announce = async (): Promise<void> => {
      const [fwd, cli] = await Promise.all([forwarderBase, cliProxyBase]);
      await writeDevRuntime(stateDir, { pid: process.pid, gateway: gateway.baseUrl, forwarder: fwd, cliProxy: cli, bindingIds: { ...connections.bindingIds } });
      const metricsLine = metricsListen
        ? `  metrics:   ${loopbackBase(metricsListen, await ports.metrics.promise)}/metrics (every part; the part label tells them apart)`
        : '  metrics:   off (--metrics-listen HOST:PORT serves them)';
      say(banner({ stateDir, url: mcpUrl(fwd, connections.bindingIds.demo ?? ''), forwarder: fwd, metricsLine, lifetimeMs, shimDir, demoBin, gateway: gateway.baseUrl, stateDirFlag: opts.stateDir }));
    };
    void announce().catch((err: unknown) => log.warn({ err: { message: (err as Error).message } }, 'could not write dev.json'));

    // Closed as soon as the stop begins, so upstream streams through the forwarder end too.
    const gatewayService: Service = {
      name: 'demo-gateway',
      async run({ signal }) {
        await new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener('abort', () => r(), { once: true })));
        await gateway.close();
      },
    };
    const services = await buildParts(parts, log, { forwarderListening: ports.forwarder.resolve, cliProxyListening: ports.cliProxy.resolve });
    // One process, one unit's worth of sd_notify: none of the parts speaks for the whole.
    await runServices([gatewayService, report, ...services], { log, notifier: createNotifier({ log, env: {} }) });
  } finally {
    await gateway.close();
    // `dev connect` must not talk to a port this run no longer holds.
    await writeDevRuntime(stateDir, { pid: null, gateway: null, forwarder: null, cliProxy: null, bindingIds: { ...connections.bindingIds } }).catch(() => undefined);
  }
}

/** What dev prints once every part is up: where things are and what to type next. */
function banner(b: { stateDir: string; url: string; forwarder: string; metricsLine: string; lifetimeMs: number; shimDir: string; demoBin: string; gateway: string; stateDirFlag: string }): string {
  return [
    '',
    'agent-connectors dev is running.',
    `  state:     ${b.stateDir}`,
    `  MCP URL:   ${b.url}`,
    `  health:    ${b.forwarder}/healthz`,
    b.metricsLine,
    `  renewal:   tokens live ${b.lifetimeMs / 1000} s; watch the "renewed" and "token applied" log lines`,
    '',
    'Point an agent at it:',
    ...AGENTS.map((a) => `  ${mcpAddCommand(a, 'connectors', b.url)}`),
    '',
    'Demo tools: echo, add, whoami (shows the token id in use), count (streams progress over SSE).',
    '',
    'A shell CLI through the cli-proxy (the CLI sees a placeholder, never the token):',
    `  PATH=${b.shimDir}:${b.demoBin}:$PATH acdemo whoami`,
    `  PATH=${b.shimDir}:${b.demoBin}:$PATH acdemo items notes`,
    '  each call is audited: the demo Gateway logs "audit event received" (provider, method, path, status)',
    'Give an agent the shim directory:',
    ...AGENTS.map((a) => `  ${pathSetupCommand(a, b.shimDir)}`),
    '',
    'Connect and disconnect demo SaaS in the platform; the host follows through its link, no edit:',
    `  page:  ${b.gateway}/demo`,
    `  ${controlCommand(b.stateDirFlag, 'connect binding sandbox')}`,
    `  ${controlCommand(b.stateDirFlag, 'disconnect binding sandbox')}`,
    `  ${controlCommand(b.stateDirFlag, 'disconnect provider demo')}`,
    '  (bindings: demo, sandbox; provider: demo)',
    'Ctrl-C stops.',
    '',
  ].join('\n');
}

function addChangeCommand(dev: Command, action: 'connect' | 'disconnect'): void {
  dev
    .command(`${action} <kind> <name>`)
    .description(`${action} a demo binding or provider in the running dev's demo platform, and wait until the host shows it`)
    .option('--timeout-ms <n>', 'how long to wait for the host', '15000')
    .addHelpText('after', "\n<kind> <name>: binding demo, binding sandbox, provider demo.\nThe running dev is found through <state>/dev.json: give dev's --state-dir if it was not ./.state.\nExit codes: 0 shown by the host, 1 not shown in time, 2 unknown name or no dev running.\n")
    // --state-dir is dev's own option (commander gives it to the parent wherever it is written).
    .action(async (kind: string, name: string, opts: { timeoutMs: string }, cmd: Command) => {
      const { stateDir } = cmd.optsWithGlobals<{ stateDir: string }>();
      await changeDemoConnection({
        stateDir: resolve(stateDir),
        action,
        kind: parseOption(demoKindSchema, kind, '<kind>') as DemoKind,
        name: parseOption(demoNameSchema, name, '<name>'),
        timeoutMs: parseOption(positiveInt, opts.timeoutMs, '--timeout-ms'),
        say: (line) => process.stdout.write(`${line}\n`),
      });
    });
}

export function registerDevCommand(program: Command): void {
  const dev = addMetricsFlag(
    program
      .command('dev')
      .description('a managed host and its demo platform in one process, state under ./.state (no root, no systemd)')
      .option('--state-dir <dir>', 'state root for the demo', DEFAULT_DEV_STATE)
      .option('--listen <host:port>', 'forwarder address', DEFAULT_FORWARDER_LISTEN)
      .option('--cli-listen <host:port>', 'cli-proxy address', DEFAULT_CLI_PROXY_LISTEN),
    { default: DEFAULT_DEV_METRICS_LISTEN },
  )
    .option('--token-lifetime-s <n>', 'lifetime of demo tokens; renewal runs at 2/3 of it', '60')
    .addOption(logLevelOption())
    .action(runDev);
  addChangeCommand(dev, 'connect');
  addChangeCommand(dev, 'disconnect');
}
