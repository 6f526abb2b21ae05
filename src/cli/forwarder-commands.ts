import { randomBytes } from 'node:crypto';
import { lstat, readFile, unlink } from 'node:fs/promises';
import { resolve } from 'node:path';
import { DEFAULT_CREDENTIAL_PATH, GATEWAY_URL_ENV, linkFiles } from '../link/enroll.js';
import type { Command } from 'commander';
import { Option } from 'commander';
import { z } from 'zod';
import { handoffPaths } from '../data/handoff.js';
import { ensureSlot, retireSlot } from '../apply/slot-admin.js';
import { instanceSlot } from '../data/renew-wire.js';
import { tokenPath } from '../data/token-path.js';
import { ConfigError } from '../errors.js';
import { readInstances, updateInstances } from '../data/registry.js';
import { bindingIdSchema, bindingSchema, type Binding } from '../data/registry.js';
import { AGENTS, mcpAddCommand, mcpUrl, type AgentName } from './mcp-add.js';
import { DEFAULT_FORWARDER_LISTEN } from '../wiring/defaults.js';
import { layoutFrom, loggerFrom, parseOption } from '../wiring/options.js';
import { addForwarderFlags, forwarderPartsFrom } from '../wiring/proxy-parts.js';

const serverName = z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'must match [A-Za-z0-9_-]{1,64}');

interface StateOpts {
  stateDir?: string;
  instances?: string;
  handoff?: string;
  credential?: string;
}

/**
 * SPEC §8: an enrolled host is managed by its Gateway; bindings come from the desired
 * state, so bind and unbind refuse (exit 2) and name the Gateway. Enrolled means the host
 * credential exists; the Gateway URL is read from link.env beside it.
 */
export async function refuseIfEnrolled(credential: string | undefined, command: string): Promise<void> {
  const files = linkFiles(resolve(credential ?? DEFAULT_CREDENTIAL_PATH));
  // lstat, not read: the credential is a secret, and a non-root user cannot read it anyway.
  const enrolled = await lstat(files.credential).then(
    () => true,
    (err: NodeJS.ErrnoException) => err.code !== 'ENOENT',
  );
  if (!enrolled) return;
  const env = await readFile(files.env, 'utf8').catch(() => '');
  const line = env.split('\n').find((l) => l.startsWith(`${GATEWAY_URL_ENV}=`));
  const gateway = line ? line.slice(GATEWAY_URL_ENV.length + 1).trim() : '(unknown: link.env has no Gateway URL)';
  throw new ConfigError(
    `this host is enrolled with the Gateway ${gateway}: its bindings are managed there, so \`${command}\` is refused; connect or disconnect in the platform (or \`agent-connectors unenroll\` to manage this host by hand)`,
  );
}

const credentialHelp = `host credential whose presence marks the host enrolled (default: ${DEFAULT_CREDENTIAL_PATH})`;

export function registerForwarderCommands(program: Command): void {
  addForwarderFlags(program.command('forwarder'))
    .description('serve http://127.0.0.1:14323/i/<bindingId>/mcp, injecting each binding\'s token')
    .action(async (opts: Record<string, string>) => {
      await (await import('../wiring/build-parts.js')).runParts(forwarderPartsFrom(opts), loggerFrom(opts));
    });

  program
    .command('bind')
    .description('add or replace a binding in instances.json (prints the binding id)')
    .argument('[bindingId]', 'binding id, [A-Za-z0-9_-]{8,128}; a random one when omitted')
    .requiredOption('--instance-id <id>', 'AgentInstance id this binding serves')
    .requiredOption('--upstream <url>', 'Gateway MCP URL (https:, or http: to loopback)')
    .option('--token-file <file>', 'token file (default: <state>/mcp-forwarder/<instanceId>.token)')
    .option('--state-dir <dir>', 'state root')
    .option('--instances <file>', 'binding registry file')
    .option('--handoff <dir>', 'renewal hand-off directory (default: <state>/handoff)')
    .option('--credential <file>', credentialHelp)
    .action(async (id: string | undefined, opts: Record<string, string>) => {
      await refuseIfEnrolled(opts.credential, 'bind');
      const bindingId = id ? parseOption(bindingIdSchema, id, 'bindingId') : randomBytes(24).toString('base64url');
      const layout = layoutFrom(opts);
      const binding: Binding = parseOption(
        bindingSchema,
        {
          instanceId: opts.instanceId,
          upstreamUrl: opts.upstream,
          tokenFile: tokenPath({ kind: 'instance', id: opts.instanceId ?? '' }, layout, opts.tokenFile ? resolve(opts.tokenFile) : undefined),
        },
        'bind',
      );
      await updateInstances(layout.instances, (current) => ({ next: { ...current, [bindingId]: binding }, result: undefined }));
      // The slot tells renew fetch this instance needs a token (tokenId null → renewed at once).
      await ensureSlot(handoffPaths(layout.handoff), instanceSlot(binding.instanceId));
      process.stdout.write(`${bindingId}\n`);
    });

  program
    .command('unbind')
    .description('remove a binding from instances.json')
    .argument('<bindingId>')
    .option('--state-dir <dir>', 'state root')
    .option('--instances <file>', 'binding registry file')
    .option('--handoff <dir>', 'renewal hand-off directory (default: <state>/handoff)')
    .option('--credential <file>', credentialHelp)
    .action(async (id: string, opts: StateOpts) => {
      await refuseIfEnrolled(opts.credential, 'unbind');
      const layout = layoutFrom(opts);
      const removed = await updateInstances(layout.instances, (current) => {
        if (!Object.hasOwn(current, id)) return { next: current, result: undefined };
        const { [id]: gone, ...rest } = current;
        const stillUsed = Object.values(rest).some((b) => b.instanceId === gone?.instanceId);
        const fileStillUsed = Object.values(rest).some((b) => b.tokenFile === gone?.tokenFile);
        return { next: rest, result: { instanceId: gone?.instanceId ?? '', tokenFile: gone?.tokenFile ?? '', stillUsed, fileStillUsed } };
      });
      if (!removed) throw new ConfigError(`no such binding: ${id.slice(0, 4)}…`);
      // Last binding of the instance gone: stop renewing its token, and delete it at once.
      if (!removed.stillUsed) await retireSlot(handoffPaths(layout.handoff), instanceSlot(removed.instanceId));
      if (!removed.stillUsed && !removed.fileStillUsed && removed.tokenFile) {
        await unlink(removed.tokenFile).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'ENOENT') throw err;
        });
      }
    });

  program
    .command('list')
    .description('list bindings (the file is readable only by its owner, so full ids are shown)')
    .option('--json', 'print instances.json as JSON')
    .option('--state-dir <dir>', 'state root')
    .option('--instances <file>', 'binding registry file')
    .action(async (opts: StateOpts & { json?: boolean }) => {
      const all = await readInstances(layoutFrom(opts).instances);
      if (opts.json) {
        process.stdout.write(`${JSON.stringify(all, null, 2)}\n`);
        return;
      }
      for (const [id, b] of Object.entries(all)) {
        process.stdout.write(`${id}\t${b.instanceId}\t${b.upstreamUrl}\t${b.tokenFile}\n`);
      }
    });

  program
    .command('mcp-add')
    .description("print the agent's own command that adds this binding as an MCP server; without --agent, the plain URL for any Streamable HTTP MCP client")
    .argument('<bindingId>')
    .addOption(new Option('--agent <agent>', 'which agent').choices([...AGENTS]))
    .option('--name <name>', 'MCP server name in the agent', 'connectors')
    .option('--url-base <url>', 'forwarder base URL', `http://${DEFAULT_FORWARDER_LISTEN}`)
    .action((id: string, opts: { agent?: AgentName; name: string; urlBase: string }) => {
      const bindingId = parseOption(bindingIdSchema, id, 'bindingId');
      const name = parseOption(serverName, opts.name, '--name');
      const url = mcpUrl(opts.urlBase, bindingId);
      // Onboarding is by capability, not by brand: any Streamable HTTP client takes the URL.
      process.stdout.write(`${opts.agent ? mcpAddCommand(opts.agent, name, url) : url}\n`);
    });
}
