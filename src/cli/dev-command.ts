import { randomBytes } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { Command } from 'commander';
import { defaultInstancesPath, defaultTokenPath, forwarderDir } from '../config/state-dir.js';
import { DemoGateway } from '../dev/demo-gateway.js';
import { createForwarderService } from '../forwarder/forwarder-service.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { defaultUpstreamOptions } from '../http/dispatch.js';
import { parseListen } from '../http/loopback.js';
import { DEFAULT_BODY_LIMIT } from '../http/request-body.js';
import { createLogger } from '../log/logger.js';
import { updateInstances } from '../registry/registry-edit.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { DEFAULT_FORWARDER_LISTEN } from './forwarder-commands.js';
import { AGENTS, mcpAddCommand, mcpUrl } from './mcp-add.js';
import { logLevel, parseOption } from './options.js';

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

export function registerDevCommand(program: Command): void {
  program
    .command('dev')
    .description('run every part against a built-in demo Gateway, state under ./.state (no root, no systemd)')
    .option('--state-dir <dir>', 'state root for the demo', './.state')
    .option('--listen <host:port>', 'forwarder address', DEFAULT_FORWARDER_LISTEN)
    .option('--log-level <level>', 'log level', 'info')
    .action(async (opts: { stateDir: string; listen: string; logLevel: string }) => {
      const listen = parseListen(opts.listen);
      const log = createLogger(parseOption(logLevel, opts.logLevel, '--log-level'));
      const stateDir = resolve(opts.stateDir);
      await mkdir(forwarderDir(stateDir), { recursive: true, mode: 0o700 });

      const gateway = new DemoGateway(log.child({ part: 'demo-gateway' }));
      await gateway.listen(0);
      const tokenFile = defaultTokenPath(stateDir, DEMO_INSTANCE);
      const { token, tokenId } = gateway.mint();
      await atomicWrite(tokenFile, `${token}\n`, { mode: 0o600 });
      const instancesPath = defaultInstancesPath(stateDir);
      const bindingId = await ensureDemoBinding(instancesPath, gateway.mcpUrl, tokenFile);
      log.info({ tokenId, gateway: gateway.mcpUrl }, 'demo gateway up; token written');

      const forwarder = createForwarderService({
        config: {
          listen,
          instancesPath,
          bodyLimit: DEFAULT_BODY_LIMIT,
          upstream: defaultUpstreamOptions,
          shutdownGraceMs: 2_000,
        },
        log: log.child({ part: 'forwarder' }),
        notifier: createNotifier({ log, env: {} }),
        onListening: (port) => {
          const base = `http://${listen.host.includes(':') ? `[${listen.host}]` : listen.host}:${port}`;
          const url = mcpUrl(base, bindingId);
          const lines = [
            '',
            'agent-connectors dev is running.',
            `  state:     ${stateDir}`,
            `  MCP URL:   ${url}`,
            `  health:    ${base}/healthz`,
            '',
            'Point an agent at it:',
            ...AGENTS.map((a) => `  ${mcpAddCommand(a, 'connectors', url)}`),
            '',
            'Demo tools: echo, add, whoami, count (streams progress over SSE). Ctrl-C stops.',
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
      process.exitCode = await runServices([forwarder, gatewayService], log);
    });
}
