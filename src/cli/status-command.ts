import { resolve } from 'node:path';
import type { Command } from 'commander';
import { hostStatus, statusText } from '../doctor/status.js';
import { DEFAULT_CREDENTIAL_PATH } from '../link/enroll.js';
import { version } from '../version.js';
import { DEFAULT_CLI_PROXY_LISTEN } from './cli-proxy-commands.js';
import { DEFAULT_FORWARDER_LISTEN } from './forwarder-commands.js';
import { layoutFrom } from './options.js';

export function registerStatusCommand(program: Command): void {
  program
    .command('status')
    .description('the host at a glance: parts up or down, enrolment and link, applied version, slots with time to expiry (doctor is the checker)')
    .option('--state-dir <dir>', 'state root')
    .option('--handoff <dir>', 'renewal hand-off directory (default: <state>/handoff)')
    .option('--forwarder-url <url>', 'forwarder base URL', `http://${DEFAULT_FORWARDER_LISTEN}`)
    .option('--cli-proxy-url <url>', 'cli-proxy base URL', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--credential <file>', 'the host credential; its presence marks the host enrolled', DEFAULT_CREDENTIAL_PATH)
    .option('--no-systemd', 'do not ask systemd about the link and apply')
    .option('--json', 'print one JSON document (format agent-connectors.status/1)')
    .action(async (opts: { stateDir?: string; handoff?: string; forwarderUrl: string; cliProxyUrl: string; credential: string; systemd: boolean; json?: boolean }) => {
      const layout = layoutFrom(opts);
      const now = Date.now();
      const status = await hostStatus({
        handoffDir: layout.handoff,
        credentialPath: resolve(opts.credential),
        forwarderUrl: opts.forwarderUrl,
        cliProxyUrl: opts.cliProxyUrl,
        systemd: opts.systemd,
        version,
        now,
      });
      process.stdout.write(opts.json ? `${JSON.stringify(status, null, 2)}\n` : statusText(status, now));
    });
}
