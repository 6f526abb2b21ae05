#!/usr/bin/env node
import { Command, CommanderError } from 'commander';
import { exitCodeOf } from './errors.js';
import { version } from './version.js';
import { registerForwarderCommands } from './cli/forwarder-commands.js';
import { registerDevCommand } from './cli/dev-command.js';
import { registerRenewCommands } from './cli/renew-commands.js';
import { registerCliProxyCommands } from './cli/cli-proxy-commands.js';
import { registerInstallCommands } from './cli/install-commands.js';
import { registerDoctorCommand } from './cli/doctor-command.js';
import { registerStatusCommand } from './cli/status-command.js';
import { registerLinkCommands } from './cli/link-commands.js';

/**
 * Exit codes (errors.ts): 0 ok, 1 runtime failure, 2 usage or configuration error.
 * Commander exits 1 on usage errors by default; exitOverride turns those into 2.
 */
async function main(argv: string[]): Promise<number> {
  const program = new Command('agent-connectors')
    .description('Loopback MCP forwarder, token renewal and CLI credential proxy for AI agents on a Linux host')
    .version(version)
    .showHelpAfterError()
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s) });
  registerForwarderCommands(program);
  registerRenewCommands(program);
  registerCliProxyCommands(program);
  registerInstallCommands(program);
  registerDoctorCommand(program);
  registerStatusCommand(program);
  registerLinkCommands(program);
  registerDevCommand(program);
  const override = (cmd: Command): void => {
    cmd.exitOverride();
    cmd.commands.forEach(override);
  };
  override(program);

  try {
    await program.parseAsync(argv);
    return typeof process.exitCode === 'number' ? process.exitCode : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.code === 'commander.help') return 0;
      return 2;
    }
    process.stderr.write(`agent-connectors: ${(err as Error).message}\n`);
    return exitCodeOf(err);
  }
}

main(process.argv).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`agent-connectors: ${(err as Error).message}\n`);
    process.exitCode = 1;
  },
);
