#!/usr/bin/env node
import { Command, CommanderError } from 'commander';
import { version } from './version.js';

type Register = (program: Command) => void;

/**
 * Each command group, its commands and how to load it. Only the group an invocation names
 * is imported: a group module pulls in its feature (undici, zod, pino, the MCP SDK…), and
 * `status` or `--version` should not pay for `dev`'s. The names are only a routing hint:
 * a name missing here, or pointing at the wrong group, loads every group, exactly as
 * before, so a new command works before it is listed (docs/performance.md, "CLI start").
 * The order is the order of `--help`'s command list.
 */
const GROUPS: ReadonlyArray<{ commands: readonly string[]; load: () => Promise<Register> }> = [
  { commands: ['forwarder', 'bind', 'unbind', 'list', 'mcp-add'], load: async () => (await import('./cli/forwarder-commands.js')).registerForwarderCommands },
  { commands: ['renew'], load: async () => (await import('./cli/renew-commands.js')).registerRenewCommands },
  { commands: ['cli-proxy', 'shims'], load: async () => (await import('./cli/cli-proxy-commands.js')).registerCliProxyCommands },
  { commands: ['install', 'uninstall'], load: async () => (await import('./cli/install-commands.js')).registerInstallCommands },
  { commands: ['doctor'], load: async () => (await import('./cli/doctor-command.js')).registerDoctorCommand },
  { commands: ['status'], load: async () => (await import('./cli/status-command.js')).registerStatusCommand },
  { commands: ['link', 'enroll', 'unenroll'], load: async () => (await import('./cli/link-commands.js')).registerLinkCommands },
  { commands: ['dev'], load: loadDev },
];

/**
 * `dev` is not shipped in the installed package (install.ts, NOT_SHIPPED): there the
 * command stays listed and says where it runs instead of failing every `--help`.
 */
async function loadDev(): Promise<Register> {
  try {
    return (await import('./dev/dev-command.js')).registerDevCommand;
  } catch (err) {
    if ((err as { code?: string }).code !== 'ERR_MODULE_NOT_FOUND') throw err;
    return (program) => {
      program
        .command('dev')
        .description('the demo platform: not part of an installed package (run it from a clone: npm ci && npm run dev)')
        .allowUnknownOption()
        .allowExcessArguments()
        .action(() => {
          process.stderr.write('agent-connectors: dev is not part of the installed package; it runs from a clone of the repository: npm ci && npm run dev\n');
          process.exitCode = 2;
        });
    };
  }
}

/**
 * The groups to register for these arguments. The program's own options are only
 * --version and --help, so the first word not starting with '-' is the command.
 */
function groupsFor(args: readonly string[]): typeof GROUPS {
  if (args.length === 1 && (args[0] === '--version' || args[0] === '-V')) return [];
  const word = args.find((a) => !a.startsWith('-'));
  const named = GROUPS.filter((g) => word !== undefined && g.commands.includes(word));
  return named.length === 1 ? named : GROUPS;
}

function buildProgram(): Command {
  return new Command('agent-connectors')
    .description('Loopback MCP forwarder, token renewal and CLI credential proxy for AI agents on a Linux host')
    .version(version)
    .showHelpAfterError()
    .exitOverride()
    .configureOutput({ writeErr: (s) => process.stderr.write(s) });
}

async function programFor(args: readonly string[]): Promise<Command> {
  const groups = groupsFor(args);
  const program = buildProgram();
  for (const register of await Promise.all(groups.map((g) => g.load()))) register(program);
  const word = args.find((a) => !a.startsWith('-'));
  if (groups.length !== 1 || program.commands.some((c) => c.name() === word)) return program;
  // The hint was wrong: start again with every group, so nothing but speed depends on it.
  const all = buildProgram();
  for (const register of await Promise.all(GROUPS.map((g) => g.load()))) register(all);
  return all;
}

/**
 * Exit codes (errors.ts): 0 ok, 1 runtime failure, 2 usage or configuration error.
 * Commander exits 1 on usage errors by default; exitOverride turns those into 2.
 */
async function main(argv: string[]): Promise<number> {
  const program = await programFor(argv.slice(2));
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
    // Loaded here, not at start: errors.ts brings undici, which a successful `--version` never needs.
    const { exitCodeOf } = await import('./errors.js');
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
