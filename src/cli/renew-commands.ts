import { type Command } from 'commander';
import { loggerFrom } from '../wiring/options.js';
import { addApplyFlags, applyPartsFrom } from '../wiring/apply-part.js';
import { addLinkFlags } from '../wiring/link-part.js';
import { runLink } from './link-commands.js';

export function registerRenewCommands(program: Command): void {
  const renew = program.command('renew').description('token renewal: fetch (alias of `link`, holds the host credential) and apply (writes token files)');

  addLinkFlags(
    renew
      .command('fetch')
      .description('alias of `agent-connectors link` (for one release): renewals, and on an enrolled host the state poll and presence'),
  ).action(runLink);

  addApplyFlags(renew.command('apply'))
    .description('write fetched tokens from the hand-off inbox into token files, and the desired state into the registry, catalog and shims')
    .action(async (opts: Record<string, string | boolean | undefined>) => {
      await (await import('../wiring/build-parts.js')).runParts(applyPartsFrom(opts), loggerFrom(opts));
    });
}
