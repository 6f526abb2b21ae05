import { resolve } from 'node:path';
import type { Command } from 'commander';
import { version } from '../version.js';
import { addHostOptions } from './doctor-command.js';
import { layoutFrom } from '../wiring/options.js';

export function registerStatusCommand(program: Command): void {
  addHostOptions(
    program
      .command('status')
      .description('the host at a glance: parts up or down, enrolment and link, applied version, slots with time to expiry (doctor is the checker)'),
  )
    .option('--no-systemd', 'do not ask systemd about the link and apply')
    .option('--json', 'print one JSON document (format agent-connectors.status/1)')
    .action(async (opts: { stateDir?: string; handoff?: string; forwarderUrl: string; cliProxyUrl: string; credential: string; systemd: boolean; json?: boolean }) => {
      // Loaded when status runs, not for its --help.
      const { hostStatus, statusText } = await import('../doctor/status.js');
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
        auditDir: layout.audit,
      });
      process.stdout.write(opts.json ? `${JSON.stringify(status, null, 2)}\n` : statusText(status, now));
    });
}
