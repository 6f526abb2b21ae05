import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { defaultHandoffDir, defaultInstancesPath, defaultProvidersPath, defaultTokenPath, forwarderDir } from '../config/state-dir.js';
import { DemoGateway } from '../dev/demo-gateway.js';
import { createForwarderService } from '../forwarder/forwarder-service.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { defaultUpstreamOptions } from '../http/dispatch.js';
import { parseListen } from '../http/loopback.js';
import { DEFAULT_BODY_LIMIT } from '../http/request-body.js';
import { createLogger } from '../log/logger.js';
import { updateInstances } from '../registry/registry-edit.js';
import { createApplyService } from '../renew/apply-service.js';
import { RenewAuthority } from '../renew/authority.js';
import { createFetchService, defaultFetchConfig } from '../renew/fetch-service.js';
import { writeSlotFile } from '../renew/apply.js';
import { emptySlotFile, handoffPaths } from '../renew/handoff.js';
import { tokenFilesFor } from '../renew/token-targets.js';
import { instanceSlot } from '../renew/wire.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { DEFAULT_FORWARDER_LISTEN } from './forwarder-commands.js';
import { AGENTS, mcpAddCommand, mcpUrl } from './mcp-add.js';
import { logLevel, parseOption, positiveInt } from './options.js';

const DEMO_INSTANCE = 'demo';

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
 * Gateway: forwarder, renew fetch (with a throw-away host credential) and renew apply
 * (watch mode). Tokens live `--token-lifetime-s` (60 s), so rotations show in the log
 * while an agent keeps its session.
 */
export function registerDevCommand(program: Command): void {
  program
    .command('dev')
    .description('run every part against a built-in demo Gateway, state under ./.state (no root, no systemd)')
    .option('--state-dir <dir>', 'state root for the demo', './.state')
    .option('--listen <host:port>', 'forwarder address', DEFAULT_FORWARDER_LISTEN)
    .option('--token-lifetime-s <n>', 'lifetime of demo tokens; renewal runs at 2/3 of it', '60')
    .option('--log-level <level>', 'log level', 'info')
    .action(async (opts: { stateDir: string; listen: string; logLevel: string; tokenLifetimeS: string }) => {
      const listen = parseListen(opts.listen);
      const log = createLogger(parseOption(logLevel, opts.logLevel, '--log-level'));
      const lifetimeMs = parseOption(positiveInt, opts.tokenLifetimeS, '--token-lifetime-s') * 1000;
      const stateDir = resolve(opts.stateDir);
      await mkdir(forwarderDir(stateDir), { recursive: true, mode: 0o700 });
      const slot = instanceSlot(DEMO_INSTANCE);

      // A fresh host credential per run: the demo Gateway forgets everything on exit.
      const credentialPath = join(stateDir, 'host-credential');
      const credential = `hc_${randomBytes(24).toString('base64url')}`;
      await atomicWrite(credentialPath, `${credential}\n`, { mode: 0o600 });
      const authority = new RenewAuthority({ credential, tokenLifetimeMs: lifetimeMs, slots: [slot], tokenPrefix: 'demo_' });
      const gateway = new DemoGateway(log.child({ part: 'demo-gateway' }), authority);
      await gateway.listen(0);

      const instancesPath = defaultInstancesPath(stateDir);
      const tokenFile = defaultTokenPath(stateDir, DEMO_INSTANCE);
      const bindingId = await ensureDemoBinding(instancesPath, gateway.mcpUrl, tokenFile);
      const paths = handoffPaths(defaultHandoffDir(stateDir));
      // The demo Gateway is new each run: what an earlier run applied or fetched means
      // nothing to it, so start the slot and fetch's private state afresh.
      await rm(join(stateDir, 'renew-fetch'), { recursive: true, force: true });
      await writeSlotFile(paths, emptySlotFile(slot));
      log.info({ gateway: gateway.baseUrl, tokenLifetimeS: lifetimeMs / 1000 }, 'demo gateway up');

      const quiet = createNotifier({ log, env: {} });
      const fetch = createFetchService({
        config: {
          ...defaultFetchConfig,
          gatewayUrl: gateway.baseUrl,
          credentialPath,
          handoffDir: paths.root,
          privateDir: join(stateDir, 'renew-fetch'),
        },
        log: log.child({ part: 'renew-fetch' }),
        notifier: quiet,
      });
      const targets = { stateDir, instancesPath, providersPath: defaultProvidersPath(stateDir) };
      const apply = createApplyService({
        config: { watch: true, rescanMs: 30_000 },
        apply: { paths, tokenFilesFor: (s) => tokenFilesFor(s, targets), log: log.child({ part: 'renew-apply' }) },
        log: log.child({ part: 'renew-apply' }),
        notifier: quiet,
      });
      const forwarder = createForwarderService({
        config: {
          listen,
          instancesPath,
          bodyLimit: DEFAULT_BODY_LIMIT,
          upstream: defaultUpstreamOptions,
          shutdownGraceMs: 2_000,
        },
        log: log.child({ part: 'forwarder' }),
        notifier: quiet,
        onListening: (port) => {
          const base = `http://${listen.host.includes(':') ? `[${listen.host}]` : listen.host}:${port}`;
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
            'Ctrl-C stops.',
            '',
          ];
          process.stderr.write(lines.join('\n'));
        },
      });

      const gatewayService: Service = {
        name: 'demo-gateway',
        async run(signal) {
          await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
          await gateway.close();
        },
      };
      process.exitCode = await runServices([gatewayService, apply, fetch, forwarder], log);
    });
}
