import { resolve } from 'node:path';
import type { Command } from 'commander';
import { install, uninstall, upgradeNames, type Action } from '../install/install.js';

function report(actions: Action[], dryRun: boolean): void {
  const width = Math.max(0, ...actions.map((a) => a.what.length));
  for (const a of actions) process.stdout.write(`${dryRun ? 'would ' : ''}${a.what.padEnd(width)}  ${a.path}\n`);
  if (actions.length === 0) process.stdout.write('nothing to do\n');
}

export function registerInstallCommands(program: Command): void {
  program
    .command('install')
    .description('install the package, systemd units, sysusers.d and tmpfiles.d files (run as root)')
    .option('--prefix <dir>', 'package goes to <prefix>/lib/agent-connectors, the CLI to <prefix>/bin', '/usr/local')
    .option('--root <dir>', 'write everything under this directory instead of / (image builds, tests)', '/')
    .option('--node <path>', 'node binary the units run', process.execPath)
    .option('--dry-run', 'print what would be done, change nothing')
    .option('--no-activate', 'do not run systemd-sysusers, systemd-tmpfiles and daemon-reload')
    .option('--agent-user <name>', 'a user whose agents may call the proxies (repeatable; added to /etc/agent-connectors/agent-users)', (v: string, acc: string[]) => [...acc, v], [] as string[])
    .action(async (opts: { prefix: string; root: string; node: string; dryRun?: boolean; activate: boolean; agentUser: string[] }) => {
      const dryRun = Boolean(opts.dryRun);
      const actions = await install({
        prefix: resolve(opts.prefix),
        root: resolve(opts.root),
        node: resolve(opts.node),
        dryRun,
        activate: opts.activate,
        agentUsers: opts.agentUser,
      });
      report(actions, dryRun);
      if (!dryRun) {
        process.stdout.write(
          '\nNext: agent-connectors enroll --gateway URL (it asks for the pairing code the platform shows),\n' +
            'then: systemctl enable --now agent-connectors.target\n' +
            (opts.agentUser.length === 0
              ? 'Only the users named in /etc/agent-connectors/agent-users may call the proxies: add yours with\n' +
                '  install --agent-user NAME (or edit the file; the proxies pick it up at once).\n'
              : ''),
        );
      }
    });
  program
    .command('upgrade-names', { hidden: true })
    .description("the .deb's postinst: move 0.1.0's renew-fetch unit, state and env file to the link's names")
    .action(async () => {
      // dpkg shows this output: only what was done, nothing on a host with nothing to move.
      for (const a of await upgradeNames()) process.stdout.write(`agent-connectors: ${a.what} ${a.path}\n`);
    });
  program
    .command('uninstall')
    .description('remove what install put in place; state under /var/lib stays unless --purge')
    .option('--prefix <dir>', 'install prefix', '/usr/local')
    .option('--root <dir>', 'root the installation was written under', '/')
    .option('--dry-run', 'print what would be done, change nothing')
    .option('--purge', 'also delete /var/lib/agent-connectors (registry, catalog, tokens) and fetch\'s state')
    .action(async (opts: { prefix: string; root: string; dryRun?: boolean; purge?: boolean }) => {
      const dryRun = Boolean(opts.dryRun);
      report(await uninstall({ prefix: resolve(opts.prefix), root: resolve(opts.root), dryRun, purge: Boolean(opts.purge) }), dryRun);
    });
}
