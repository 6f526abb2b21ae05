import { hostname } from 'node:os';
import { dirname, resolve } from 'node:path';
import type { Command } from 'commander';
import { upstreamUrlSchema } from '../data/fields.js';
import { LINK_ENV_HOST_ID } from '../data/link-env.js';
import { DEFAULT_CREDENTIAL_PATH, enroll, unenroll } from '../link/enroll.js';
import { adoptOldPrivateState } from '../link/private-state.js';
import { readPairingCode } from '../link/pairing-code.js';
import { version } from '../version.js';
import { layoutFrom, loggerFrom, parseOption, positiveInt } from '../wiring/options.js';
import { addLinkFlags, linkPartsFrom } from '../wiring/link-part.js';

/** `link` and `renew fetch`: renewals, plus the state poller, presence and audit upload when enrolled. */
export async function runLink(opts: Record<string, string | boolean | undefined>): Promise<void> {
  const log = loggerFrom(opts);
  const { parts, enrolled } = await linkPartsFrom(opts);
  if (!enrolled && !opts.once) log.info(`no host id (--host-id, $${LINK_ENV_HOST_ID}, link.env): this host is not enrolled; running renewals only`);
  const privateDir = parts.link?.renewal.privateDir;
  const adopted = privateDir && (await adoptOldPrivateState({ root: dirname(privateDir), linkPrivate: privateDir }));
  if (adopted) log.info({ from: adopted, to: privateDir }, "the link's private state moved to its new name (pending renewals keep their requestIds)");
  await (await import('../wiring/build-parts.js')).runParts(parts, log);
}

/** Human lines for the person at the terminal; stdout, as `bind` prints its results. */
function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

export function registerLinkCommands(program: Command): void {
  addLinkFlags(
    program
      .command('link')
      .description(
        "the host's link to the Gateway (holds the host credential): token renewals, and on an enrolled host the desired-state long poll (hands desired-state.json to apply) and presence",
      ),
  ).action(runLink);

  program
    .command('enroll')
    .description('enrol this host with the Gateway: a one-time pairing code (stdin, or prompted without echo) becomes the host credential')
    .requiredOption('--gateway <url>', 'the Gateway base URL (https; http only to loopback)')
    .option('--credential <file>', 'where to store the host credential (0600); link.env goes beside it', DEFAULT_CREDENTIAL_PATH)
    .option('--force', 'enrol again a host that is already enrolled (replaces its credential)')
    .option('--attempts <n>', 'tries on 429, 5xx and network errors, all with one requestId', '6')
    .option('--handoff <dir>', 'the hand-off directory apply watches: a revocation left there by unenroll or a 401 is lifted (default: <state>/handoff)')
    .addHelpText('after', '\nThe pairing code is never an argument (every local user can read argv):\n  sudo agent-connectors enroll --gateway https://gw.example.com        (prompts)\n  sudo agent-connectors enroll --gateway https://gw.example.com < code.txt\nExit codes: 0 enrolled, 1 enrolment failed (the message says why and what to do), 2 usage.\n')
    .action(async (opts: { gateway: string; credential: string; force?: boolean; attempts: string; handoff?: string }) => {
      const gatewayUrl = parseOption(upstreamUrlSchema, opts.gateway, '--gateway');
      await enroll({
        gatewayUrl,
        credentialPath: resolve(opts.credential),
        force: Boolean(opts.force),
        readCode: () => readPairingCode(),
        hostname: hostname(),
        version,
        attempts: parseOption(positiveInt, opts.attempts, '--attempts'),
        handoffDir: layoutFrom(opts).handoff,
        say,
      });
    });

  program
    .command('unenroll')
    .description('stop the link, have apply delete every token file and shim (the host serves nothing until enrolled again) and remove the host credential')
    .option('--credential <file>', 'the host credential file enroll wrote', DEFAULT_CREDENTIAL_PATH)
    .option('--handoff <dir>', 'the hand-off directory apply watches (default: <state>/handoff)')
    .action(async (opts: { credential: string; handoff?: string }) => {
      await unenroll({ credentialPath: resolve(opts.credential), handoffDir: layoutFrom(opts).handoff, say });
    });
}
