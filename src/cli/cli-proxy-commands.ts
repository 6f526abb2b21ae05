import { join, resolve } from 'node:path';
import { Option, type Command } from 'commander';
import { ALLOWED_COMMANDS_FILE, readAllowedCommands } from '../data/allowed-commands.js';
import { PROVIDER_PORT_MAX, PROVIDER_PORT_MIN, providerPorts, readCatalog } from '../data/catalog.js';
import { hostToolProblem } from '../data/catalog-rules.js';
import { CA_CERT_FILE, CA_FILE, defaultCaBundle, SYSTEM_SHIM_DIR } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { parseListen } from '../http/loopback.js';
import { handoffPaths } from '../data/handoff.js';
import { ensureSlot } from '../apply/slot-admin.js';
import { cliSlot } from '../data/renew-wire.js';
import { installShims } from '../shims/install.js';
import { AGENTS, type AgentName } from './mcp-add.js';
import { codexOverrideWords, sandboxNote } from './agent-sandbox.js';
import { layoutFrom, loggerFrom } from '../wiring/options.js';
import { defaultShimDir } from '../wiring/apply-part.js';
import { addCliProxyFlags, cliProxyPartsFrom } from '../wiring/proxy-parts.js';
import { DEFAULT_CLI_PROXY_LISTEN } from '../wiring/defaults.js';


/** How to give an agent the shim directory: first on its PATH, and (Codex) its sandbox's network open to the cli-proxy. */
export function pathSetupCommand(agent: AgentName, dir: string): string {
  switch (agent) {
    case 'openclaw':
      return `openclaw config set tools.exec.pathPrepend ${dir}`;
    case 'claude':
      return `PATH=${dir}:$PATH claude   # or put ${dir} first on PATH in the agent user's environment`;
    case 'codex':
      return `PATH=${dir}:$PATH codex ${codexOverrideWords()}   # or put ${dir} first on PATH in the agent user's environment`;
  }
}

/**
 * The provider ports of the catalog in force (SPEC §10: each on 127.0.0.1, where a
 * sandbox must let the agent's commands reach), as a comment; undefined when it names none.
 */
async function providerPortsLine(path: string): Promise<string | undefined> {
  const range = `provider ports (${PROVIDER_PORT_MIN}-${PROVIDER_PORT_MAX})`;
  try {
    const ports = [...providerPorts(await readCatalog(path))].sort(([a], [b]) => a - b);
    return ports.length ? `# ${range}, on 127.0.0.1: ${ports.map(([port, name]) => `${name} ${port}`).join(', ')}` : undefined;
  } catch (err) {
    // Not fatal: the PATH line above is what this command is for (the catalog is 0600, root reads it).
    return `# ${range}: ${path} ${err instanceof ConfigError ? 'is invalid' : `cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`}`;
  }
}

export function registerCliProxyCommands(program: Command): void {
  addCliProxyFlags(program.command('cli-proxy'))
    .description('serve http://127.0.0.1:14324/p/<provider>/…, injecting each provider\'s token for shell CLIs')
    .action(async (opts: Record<string, string | boolean | undefined>) => {
      await (await import('../wiring/build-parts.js')).runParts(cliProxyPartsFrom(opts), loggerFrom(opts));
    });

  const shims = program.command('shims').description('PATH shims that point shell CLIs at the cli-proxy');
  shims
    .command('install')
    .description('write one shim per catalog command into the shim directory (and remove stale ones)')
    .option('--dir <dir>', `shim directory (default: ${SYSTEM_SHIM_DIR} as root, else <state>/shims)`)
    .option('--proxy-url <url>', 'cli-proxy base URL baked into the shims', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--state-dir <dir>', 'state root')
    .option('--providers <file>', 'provider catalog (default: <state>/cli-proxy/providers.json)')
    .option('--handoff <dir>', 'renewal hand-off directory, for the providers\' cli:<provider> slots (default: <state>/handoff)')
    .option('--allowed-commands <file>', `host tools the operator lets the catalog shim, one per line (default: ${ALLOWED_COMMANDS_FILE})`)
    .option('--ca-bundle <file>', 'the CA bundle TLS-mode shims name, as the cli-proxy writes it (default: as cli-proxy --ca-bundle)')
    .action(async (opts: Record<string, string | undefined>) => {
      const layout = layoutFrom(opts);
      const catalog = await readCatalog(layout.providers);
      // The operator's own catalog is held to the Gateway's rules: a host tool only if allowed.
      const hostTool = hostToolProblem(catalog, await readAllowedCommands(opts.allowedCommands ?? ALLOWED_COMMANDS_FILE));
      if (hostTool !== undefined) throw new ConfigError(`${layout.providers} is refused (${hostTool}); no shim was written`);
      const proxyUrl = opts.proxyUrl ?? `http://${DEFAULT_CLI_PROXY_LISTEN}`;
      let parsedProxy: URL;
      try {
        parsedProxy = new URL(proxyUrl);
      } catch {
        throw new ConfigError(`--proxy-url is not a URL: ${proxyUrl}`);
      }
      parseListen(parsedProxy.host); // loopback only, like the proxy itself
      const dir = resolve(opts.dir ?? defaultShimDir(layout.root));
      const result = await installShims(catalog, dir, parsedProxy.origin, resolve(opts.caBundle ?? defaultCaBundle(layout.root)));
      const paths = handoffPaths(layout.handoff);
      for (const provider of Object.keys(catalog)) await ensureSlot(paths, cliSlot(provider));
      process.stdout.write(
        `${[`shims in ${dir}: ${result.written.join(', ') || '(none)'}`, result.removed.length ? `removed stale: ${result.removed.join(', ')}` : '']
          .filter(Boolean)
          .join('\n')}\n`,
      );
    });
  shims
    .command('path')
    .description('print how to put the shim directory first on an agent\'s PATH, and what its sandbox needs to reach the cli-proxy')
    .addOption(new Option('--agent <agent>', 'which agent').choices([...AGENTS]).makeOptionMandatory())
    .option('--dir <dir>', 'shim directory')
    .option('--state-dir <dir>', 'state root')
    .option('--ca-bundle <file>', 'the shims\' CA bundle, if not the default')
    .option('--providers <file>', 'provider catalog, for its provider ports (default: <state>/cli-proxy/providers.json)')
    .action(async (opts: { agent: AgentName; dir?: string; stateDir?: string; caBundle?: string; providers?: string }) => {
      const layout = layoutFrom(opts);
      process.stdout.write(`${pathSetupCommand(opts.agent, resolve(opts.dir ?? defaultShimDir(layout.root)))}\n`);
      process.stdout.write(`${sandboxNote(opts.agent).join('\n')}\n`);
      const ports = await providerPortsLine(layout.providers);
      if (ports) process.stdout.write(`${ports}\n`);
      // TLS mode (SPEC §10): where its trust lives, for an operator checking a CLI's failed handshake.
      process.stdout.write(
        `# TLS mode: the CLI CA's certificate ${join(layout.cliCa, CA_CERT_FILE)} (its key ${join(layout.cliCa, CA_FILE)}: the cli-proxy's user alone); the shims' CA bundle ${resolve(opts.caBundle ?? defaultCaBundle(layout.root))}\n`,
      );
    });
}
