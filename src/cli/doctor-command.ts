import type { Command } from 'commander';
import { runDoctor } from '../doctor/doctor.js';
import { DEFAULT_FORWARDER_LISTEN } from './forwarder-commands.js';
import { DEFAULT_CLI_PROXY_LISTEN } from './cli-proxy-commands.js';
import { layoutFrom } from './options.js';

export function registerDoctorCommand(program: Command): void {
  program
    .command('doctor')
    .description('check users, modes, secrets, ports, units and token freshness; print how to fix each problem')
    .option('--state-dir <dir>', 'state root')
    .option('--handoff <dir>', 'renewal hand-off directory (default: <state>/handoff)')
    .option('--agent-user <name>', 'the user AI agents run as: checked to read no secret')
    .option('--forwarder-url <url>', 'forwarder base URL', `http://${DEFAULT_FORWARDER_LISTEN}`)
    .option('--cli-proxy-url <url>', 'cli-proxy base URL', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--no-systemd', 'skip the unit checks (hosts without systemd)')
    .option('--json', 'print findings as JSON')
    .action(async (opts: { stateDir?: string; handoff?: string; agentUser?: string; forwarderUrl: string; cliProxyUrl: string; systemd: boolean; json?: boolean }) => {
      const layout = layoutFrom(opts);
      const findings = await runDoctor({
        stateDir: layout.root,
        handoffDir: layout.handoff,
        agentUser: opts.agentUser,
        forwarderUrl: opts.forwarderUrl,
        cliProxyUrl: opts.cliProxyUrl,
        systemd: opts.systemd,
      });
      if (opts.json) process.stdout.write(`${JSON.stringify(findings, null, 2)}\n`);
      else {
        for (const f of findings) {
          const mark = f.level === 'ok' ? 'ok  ' : f.level === 'warn' ? 'warn' : 'FAIL';
          process.stdout.write(`${mark}  ${f.check}: ${f.detail}\n${f.fix ? `      fix: ${f.fix}\n` : ''}`);
        }
      }
      const problems = findings.filter((f) => f.level === 'problem').length;
      if (!opts.json) process.stdout.write(problems ? `\n${problems} problem(s)\n` : '\nno problems\n');
      process.exitCode = problems ? 1 : 0;
    });
}
