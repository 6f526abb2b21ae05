import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { stateLayout } from '../data/state-layout.js';
import { DemoGateway } from '../gateway-standin/demo-gateway.js';
import { createForwarderService } from '../forwarder/forwarder-service.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { defaultUpstreamOptions } from '../http/upstream-agent.js';
import { parseListen } from '../http/loopback.js';
import { DEFAULT_BODY_LIMIT } from '../http/request-body.js';
import { updateInstances } from '../data/registry.js';
import { createApplyService } from '../renew/apply-service.js';
import { RenewAuthority } from '../gateway-standin/authority.js';
import { HostControl } from '../gateway-standin/host-control.js';
import { createFetchService, defaultFetchConfig } from '../renew/fetch-service.js';
import { writeSlotFile } from '../renew/apply.js';
import { emptySlotFile, handoffPaths } from '../data/handoff.js';
import { tokenFilesFor } from '../renew/token-targets.js';
import { cliSlot, instanceSlot } from '../data/renew-wire.js';
import type { Catalog } from '../data/catalog.js';
import { createCliProxyService } from '../cli-proxy/cli-proxy-service.js';
import { DEFAULT_AUDIT_MAX_EVENTS } from '../cli-proxy/audit-spool.js';
import { createAuditUpload, defaultAuditUploadConfig } from '../link/audit-upload.js';
import { LinkCredential } from '../link/credential.js';
import { installShims } from '../shims/install.js';
import { shQuote } from '../shims/render.js';
import { fileURLToPath } from 'node:url';
import { DEFAULT_CLI_BODY_LIMIT, DEFAULT_CLI_PROXY_LISTEN, pathSetupCommand } from './cli-proxy-commands.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { DEFAULT_FORWARDER_LISTEN } from './forwarder-commands.js';
import { AGENTS, mcpAddCommand, mcpUrl } from './mcp-add.js';
import { logLevelOption, loggerFrom, parseOption, positiveInt } from './options.js';
import { defaultTokenDirs } from './renew-commands.js';

const DEMO_INSTANCE = 'demo';
const DEMO_PROVIDER = 'demo';

function hostForUrl(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

/** The demo provider: the demo Gateway's REST API, reached by the `acdemo` CLI. */
function demoCatalog(gatewayBase: string, tokenFile: string): Catalog {
  return {
    [DEMO_PROVIDER]: {
      upstream: `${gatewayBase}/api/demo`,
      tokenFile,
      inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      commands: [{ name: 'acdemo', env: { ACDEMO_URL: '{baseUrl}', ACDEMO_TOKEN: '{placeholder}' } }],
    },
  };
}

/** Puts the real `acdemo` command (a launcher for dist/dev/demo-cli.js) in <state>/demo-bin. */
async function installDemoCli(stateDir: string): Promise<string> {
  const dir = join(stateDir, 'demo-bin');
  await mkdir(dir, { recursive: true, mode: 0o755 });
  const script = fileURLToPath(new URL('../dev/demo-cli.js', import.meta.url));
  await atomicWrite(join(dir, 'acdemo'), `#!/bin/sh\nexec ${shQuote(process.execPath)} ${shQuote(script)} "$@"\n`, { mode: 0o755 });
  return dir;
}

/**
 * Keeps the demo binding id stable across runs (an agent configured once keeps working),
 * pointing it at this run's demo Gateway port.
 */
async function ensureDemoBinding(instancesPath: string, upstreamUrl: string, tokenFile: string): Promise<string> {
  return updateInstances(instancesPath, (current) => {
    const existing = Object.entries(current).find(([, b]) => b.instanceId === DEMO_INSTANCE)?.[0];
    const id = existing ?? `demo_${randomBytes(16).toString('base64url')}`;
    return { next: { ...current, [id]: { instanceId: DEMO_INSTANCE, upstreamUrl, tokenFile } }, result: id };
  });
}

/**
 * `dev`: every part in one process, as separate Services, against the built-in demo
 * Gateway: forwarder, cli-proxy (with a demo provider and its `acdemo` shim), renew
 * fetch (with a throw-away host credential) and renew apply (watch mode). Tokens live `--token-lifetime-s` (60 s), so rotations show in the log
 * while an agent keeps its session.
 */
export function registerDevCommand(program: Command): void {
  program
    .command('dev')
    .description('run every part against a built-in demo Gateway, state under ./.state (no root, no systemd)')
    .option('--state-dir <dir>', 'state root for the demo', './.state')
    .option('--listen <host:port>', 'forwarder address', DEFAULT_FORWARDER_LISTEN)
    .option('--cli-listen <host:port>', 'cli-proxy address', DEFAULT_CLI_PROXY_LISTEN)
    .option('--token-lifetime-s <n>', 'lifetime of demo tokens; renewal runs at 2/3 of it', '60')
    .addOption(logLevelOption())
    .action(async (opts: { stateDir: string; listen: string; cliListen: string; logLevel: string; tokenLifetimeS: string }) => {
      const listen = parseListen(opts.listen);
      const cliListen = parseListen(opts.cliListen);
      const log = loggerFrom(opts);
      const lifetimeMs = parseOption(positiveInt, opts.tokenLifetimeS, '--token-lifetime-s') * 1000;
      const stateDir = resolve(opts.stateDir);
      const layout = stateLayout(stateDir);
      await mkdir(layout.forwarderDir, { recursive: true, mode: 0o700 });
      const slot = instanceSlot(DEMO_INSTANCE);
      const demoCliSlot = cliSlot(DEMO_PROVIDER);

      // A fresh host credential per run: the demo Gateway forgets everything on exit.
      const credentialPath = join(stateDir, 'host-credential');
      const credential = `hc_${randomBytes(24).toString('base64url')}`;
      await atomicWrite(credentialPath, `${credential}\n`, { mode: 0o600 });
      const authority = new RenewAuthority({ credential, tokenLifetimeMs: lifetimeMs, slots: [slot, demoCliSlot], tokenPrefix: 'demo_' });
      // The link endpoints (SPEC §8) answer too; dev's own credential counts as a host's.
      const hostControl = new HostControl({
        authority,
        staticHosts: { 'dev-host': credential },
        // What the platform would show for shell CLI calls (SPEC §9): one line per event.
        onAudit: (_host, events) => {
          for (const e of events) log.info({ part: 'demo-gateway', provider: e.provider, method: e.method, path: e.path, status: e.status, peerUid: e.peerUid }, 'audit event received');
        },
      });
      const gateway = new DemoGateway(log.child({ part: 'demo-gateway' }), authority, hostControl);
      await gateway.listen(0);
      // Whatever fails from here on (a port in use included), the demo Gateway must not
      // keep the process alive.
      try {

        const instancesPath = layout.instances;
        const tokenFile = layout.instanceToken(DEMO_INSTANCE);
        const bindingId = await ensureDemoBinding(instancesPath, gateway.mcpUrl, tokenFile);
        const paths = handoffPaths(layout.handoff);
        // The demo Gateway is new each run: what an earlier run applied or fetched means
        // nothing to it, so start the slot and fetch's private state afresh.
        await rm(layout.fetchPrivate, { recursive: true, force: true });
        await writeSlotFile(paths, emptySlotFile(slot));
        await writeSlotFile(paths, emptySlotFile(demoCliSlot));
        const providersPath = layout.providers;
        const catalog = demoCatalog(gateway.baseUrl, layout.providerToken(DEMO_PROVIDER));
        await mkdir(layout.cliProxyDir, { recursive: true, mode: 0o700 });
        await atomicWrite(providersPath, `${JSON.stringify(catalog, null, 2)}\n`, { mode: 0o600 });
        const demoBin = await installDemoCli(stateDir);
        log.info({ gateway: gateway.baseUrl, tokenLifetimeS: lifetimeMs / 1000 }, 'demo gateway up');

        const fetch = createFetchService({
          ...defaultFetchConfig,
          gatewayUrl: gateway.baseUrl,
          credentialPath,
          handoffDir: paths.root,
          privateDir: layout.fetchPrivate,
        });
        const targets = { stateDir, instancesPath, providersPath };
        const apply = createApplyService({
          watch: true,
          rescanMs: 30_000,
          paths,
          tokenFilesFor: (s) => tokenFilesFor(s, targets),
          tokenDirs: defaultTokenDirs(stateDir),
        });
        let cliPortKnown!: (port: number) => void;
        const cliPort = new Promise<number>((resolvePort) => (cliPortKnown = resolvePort));
        const cliProxy = createCliProxyService({
          config: {
            listen: cliListen,
            providersPath,
            bodyLimit: DEFAULT_CLI_BODY_LIMIT,
            upstream: defaultUpstreamOptions,
            shutdownGraceMs: 2_000,
            audit: { dir: layout.audit, maxEvents: DEFAULT_AUDIT_MAX_EVENTS },
          },
          onListening: (port) => cliPortKnown(port),
        });
        const auditUpload = createAuditUpload(
          { ...defaultAuditUploadConfig, gatewayUrl: gateway.baseUrl, dir: layout.audit, minGapMs: 500 },
          new LinkCredential(credentialPath, log.child({ part: 'link' })),
        );
        const shimDir = layout.shims;
        const forwarder = createForwarderService({
          config: {
            listen,
            instancesPath,
            bodyLimit: DEFAULT_BODY_LIMIT,
            upstream: defaultUpstreamOptions,
            shutdownGraceMs: 2_000,
          },
          onListening: async (port) => {
            const base = `http://${hostForUrl(listen.host)}:${port}`;
            await installShims(catalog, shimDir, `http://${hostForUrl(cliListen.host)}:${await cliPort}`);
            const url = mcpUrl(base, bindingId);
            const lines = [
              '',
              'agent-connectors dev is running.',
              `  state:     ${stateDir}`,
              `  MCP URL:   ${url}`,
              `  health:    ${base}/healthz`,
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
              'Ctrl-C stops.',
              '',
            ];
            process.stderr.write(lines.join('\n'));
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
        await runServices([gatewayService, apply, fetch, cliProxy, auditUpload, forwarder], { log, notifier: createNotifier({ log, env: {} }) });
      } finally {
        await gateway.close();
      }
    });
}
