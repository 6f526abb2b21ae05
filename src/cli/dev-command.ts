import { hostname } from 'node:os';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { demoKindSchema, demoNameSchema, type DemoKind } from '../data/dev-demo.js';
import { handoffPaths } from '../data/handoff.js';
import { readInstances } from '../data/registry.js';
import { stateLayout, type StateLayout } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { createCliProxyService } from '../cli-proxy/cli-proxy-service.js';
import { changeDemoConnection, readDevRuntime, writeDevRuntime } from '../dev/demo-control-client.js';
import { createHostReport } from '../dev/host-report.js';
import { createForwarderService } from '../forwarder/forwarder-service.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { RenewAuthority } from '../gateway-standin/authority.js';
import { DEMO_PROVIDER, DemoConnections } from '../gateway-standin/demo-control.js';
import { DemoGateway } from '../gateway-standin/demo-gateway.js';
import { HostControl } from '../gateway-standin/host-control.js';
import { parseListen } from '../http/loopback.js';
import { DEFAULT_BODY_LIMIT } from '../http/request-body.js';
import { defaultUpstreamOptions } from '../http/upstream-agent.js';
import { enroll, linkFiles, type Systemd } from '../link/enroll.js';
import { createLinkServices } from '../link/link.js';
import { defaultPresenceConfig } from '../link/presence.js';
import { defaultStatePollerConfig } from '../link/state-poller.js';
import { createApplyService } from '../renew/apply-service.js';
import { createFetchService, defaultFetchConfig } from '../renew/fetch-service.js';
import { tokenFilesFor } from '../renew/token-targets.js';
import { DEFAULT_AUDIT_MAX_EVENTS } from '../cli-proxy/audit-spool.js';
import { defaultAuditUploadConfig } from '../link/audit-upload.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { installShims } from '../shims/install.js';
import { shQuote } from '../shims/render.js';
import { version } from '../version.js';
import { pathSetupCommand } from './cli-proxy-commands.js';
import { DEFAULT_CLI_BODY_LIMIT, DEFAULT_CLI_PROXY_LISTEN, DEFAULT_FORWARDER_LISTEN } from './defaults.js';
import { devMetrics, devMetricsOption } from './dev-command-metrics.js';
import { AGENTS, mcpAddCommand, mcpUrl } from './mcp-add.js';
import { logLevelOption, loggerFrom, parseOption, positiveInt } from './options.js';
import { defaultTokenDirs } from './renew-commands.js';

const DEFAULT_DEV_STATE = './.state';
/** The system state root: dev wipes its host state at start, so it never runs there. */
const SYSTEM_STATE_DIR = '/var/lib/agent-connectors';

function hostForUrl(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
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
  const script = fileURLToPath(new URL('../dev/demo-cli.js', import.meta.url));
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
  for (const path of [files.credential, files.env, files.pending, layout.instances, layout.providers, layout.handoff, layout.fetchPrivate]) {
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
  const listen = parseListen(opts.listen);
  const cliListen = parseListen(opts.cliListen);
  let metricsPortKnown!: (port: number) => void;
  const metricsPort = new Promise<number>((resolvePort) => (metricsPortKnown = resolvePort));
  // Parsed before anything starts, so a bad address is a usage error (exit 2).
  const metrics = devMetrics(opts.metricsListen, [listen, cliListen], (port) => metricsPortKnown(port));
  const log = loggerFrom(opts);
  const lifetimeMs = parseOption(positiveInt, opts.tokenLifetimeS, '--token-lifetime-s') * 1000;
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

    const paths = handoffPaths(layout.handoff);
    const demoBin = await installDemoCli(stateDir);
    const shimDir = layout.shims;
    let cliPortKnown!: (port: number) => void;
    const cliPort = new Promise<number>((resolvePort) => (cliPortKnown = resolvePort));
    const cliProxyUrl = cliPort.then((port) => `http://${hostForUrl(cliListen.host)}:${port}`);
    let forwarderBase: string | undefined;
    let cliProxyBase: string | undefined;
    // Filled in as the proxies listen (a port may be 0); presence reads it at each report.
    const health: Record<string, string> = {};

    const fetch = createFetchService({
      ...defaultFetchConfig,
      gatewayUrl: gateway.baseUrl,
      credentialPath,
      handoffDir: paths.root,
      privateDir: layout.fetchPrivate,
      metrics: metrics?.renewal,
    });
    const link = createLinkServices(
      {
        credentialPath,
        poller: { ...defaultStatePollerConfig, gatewayUrl: gateway.baseUrl, handoffDir: paths.root, metrics: metrics?.link },
        presence: { ...defaultPresenceConfig, gatewayUrl: gateway.baseUrl, handoffDir: paths.root, hostId: enrolled.hostId, version, health },
        audit: { ...defaultAuditUploadConfig, gatewayUrl: gateway.baseUrl, dir: layout.audit, minGapMs: 500 },
      },
      log,
    );
    const targets = { stateDir, instancesPath: layout.instances, providersPath: layout.providers };
    const apply = createApplyService({
      watch: true,
      rescanMs: 30_000,
      paths,
      tokenFilesFor: (s) => tokenFilesFor(s, targets),
      tokenDirs: defaultTokenDirs(stateDir),
      reconcile: {
        layout,
        instancesPath: layout.instances,
        providersPath: layout.providers,
        renderShims: async (catalog) => {
          const r = await installShims(catalog, shimDir, await cliProxyUrl);
          log.info({ dir: shimDir, written: r.written.length, removed: r.removed.length }, 'shims rendered');
        },
      },
      metrics: metrics?.apply,
    });
    const report = createHostReport({
      handoffDir: paths.root,
      instancesPath: layout.instances,
      providersPath: layout.providers,
      nameOf: (id) => connections.nameOf(id),
      forwarderBase: () => forwarderBase,
      cliProxyBase: () => cliProxyBase,
      say,
    });
    const cliProxy = createCliProxyService({
      config: {
        listen: cliListen,
        providersPath: layout.providers,
        bodyLimit: DEFAULT_CLI_BODY_LIMIT,
        upstream: defaultUpstreamOptions,
        shutdownGraceMs: 2_000,
        audit: { dir: layout.audit, maxEvents: DEFAULT_AUDIT_MAX_EVENTS },
        observer: metrics?.cliProxy,
      },
      onListening: (port) => {
        cliProxyBase = `http://${hostForUrl(cliListen.host)}:${port}`;
        health['cli-proxy'] = `${cliProxyBase}/healthz`;
        cliPortKnown(port);
      },
    });
    const forwarder = createForwarderService({
      config: { listen, instancesPath: layout.instances, bodyLimit: DEFAULT_BODY_LIMIT, upstream: defaultUpstreamOptions, shutdownGraceMs: 2_000, observer: metrics?.forwarder },
      onListening: async (port) => {
        const base = `http://${hostForUrl(listen.host)}:${port}`;
        forwarderBase = base;
        health.forwarder = `${base}/healthz`;
        const cliBase = await cliProxyUrl;
        await writeDevRuntime(stateDir, { pid: process.pid, gateway: gateway.baseUrl, forwarder: base, cliProxy: cliBase, bindingIds: { ...connections.bindingIds } });
        const url = mcpUrl(base, connections.bindingIds.demo ?? '');
        const metricsLine = metrics
          ? `  metrics:   http://${hostForUrl(metrics.listen.host)}:${await metricsPort}/metrics (every part; the part label tells them apart)`
          : '  metrics:   off (--metrics-listen HOST:PORT serves them)';
        const lines = [
          '',
          'agent-connectors dev is running.',
          `  state:     ${stateDir}`,
          `  MCP URL:   ${url}`,
          `  health:    ${base}/healthz`,
          metricsLine,
          `  renewal:   tokens live ${lifetimeMs / 1000} s; watch the "renewed" and "token applied" log lines`,
          '',
          'Point an agent at it:',
          ...AGENTS.map((a) => `  ${mcpAddCommand(a, 'connectors', url)}`),
          '',
          'Demo tools: echo, add, whoami (shows the token id in use), count (streams progress over SSE).',
          '',
          'A shell CLI through the cli-proxy (the CLI sees a placeholder, never the token):',
          `  PATH=${shimDir}:${demoBin}:$PATH acdemo whoami`,
          `  PATH=${shimDir}:${demoBin}:$PATH acdemo items notes`,
          '  each call is audited: the demo Gateway logs "audit event received" (provider, method, path, status)',
          'Give an agent the shim directory:',
          ...AGENTS.map((a) => `  ${pathSetupCommand(a, shimDir)}`),
          '',
          'Connect and disconnect demo SaaS in the platform; the host follows through its link, no edit:',
          `  page:  ${gateway.baseUrl}/demo`,
          `  ${controlCommand(opts.stateDir, 'connect binding sandbox')}`,
          `  ${controlCommand(opts.stateDir, 'disconnect binding sandbox')}`,
          `  ${controlCommand(opts.stateDir, 'disconnect provider demo')}`,
          '  (bindings: demo, sandbox; provider: demo)',
          'Ctrl-C stops.',
          '',
        ];
        say(lines.join('\n'));
      },
    });

    // Closed as soon as the stop begins, so upstream streams through the forwarder end too.
    const gatewayService: Service = {
      name: 'demo-gateway',
      async run({ signal }) {
        await new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener('abort', () => r(), { once: true })));
        await gateway.close();
      },
    };
    // One process, one unit's worth of sd_notify: none of the parts speaks for the whole.
    const services = [gatewayService, apply, fetch, ...link, report, cliProxy, forwarder];
    if (metrics) services.push(metrics.service);
    await runServices(services, { log, notifier: createNotifier({ log, env: {} }) });
  } finally {
    await gateway.close();
    // `dev connect` must not talk to a port this run no longer holds.
    await writeDevRuntime(stateDir, { pid: null, gateway: null, forwarder: null, cliProxy: null, bindingIds: { ...connections.bindingIds } }).catch(() => undefined);
  }
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
  const dev = program
    .command('dev')
    .description('a managed host and its demo platform in one process, state under ./.state (no root, no systemd)')
    .option('--state-dir <dir>', 'state root for the demo', DEFAULT_DEV_STATE)
    .option('--listen <host:port>', 'forwarder address', DEFAULT_FORWARDER_LISTEN)
    .option('--cli-listen <host:port>', 'cli-proxy address', DEFAULT_CLI_PROXY_LISTEN)
    .addOption(devMetricsOption())
    .option('--token-lifetime-s <n>', 'lifetime of demo tokens; renewal runs at 2/3 of it', '60')
    .addOption(logLevelOption())
    .action(runDev);
  addChangeCommand(dev, 'connect');
  addChangeCommand(dev, 'disconnect');
}
