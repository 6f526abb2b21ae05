import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { ConfigError } from '../errors.js';
import { upstreamUrlSchema } from '../data/fields.js';
import { hostIdSchema } from '../data/link-wire.js';
import { DEFAULT_CREDENTIAL_PATH, enroll, unenroll } from '../link/enroll.js';
import { defaultAuditUploadConfig } from '../link/audit-upload.js';
import { createLinkServices } from '../link/link.js';
import { adoptOldPrivateState } from '../link/private-state.js';
import { readPairingCode } from '../link/pairing-code.js';
import { defaultPresenceConfig } from '../link/presence.js';
import { defaultStatePollerConfig } from '../link/state-poller.js';
import { createFetchService, defaultFetchConfig } from '../renew/fetch-service.js';
import { createLinkMetrics } from '../metrics/link-metrics.js';
import { createRenewalMetrics } from '../metrics/renewal-metrics.js';
import { createNotifier } from '../service/sd-notify.js';
import { runServices, type Service } from '../service/service.js';
import { version } from '../version.js';
import { addMetricsOption, metricsFrom } from './metrics-options.js';
import { layoutFrom, logLevelOption, loggerFrom, loopbackHttpUrl, parseOption, positiveInt } from './options.js';

/** The options of `link` and its alias `renew fetch`. */
export function addLinkOptions(cmd: Command): Command {
  return addMetricsOption(cmd)
    .option('--gateway <url>', 'Gateway base URL (default: $AGENT_CONNECTORS_GATEWAY_URL)')
    .option('--credential <file>', 'host credential file (default: $CREDENTIALS_DIRECTORY/host-credential)')
    .option('--handoff <dir>', 'hand-off directory (default: <state>/handoff)')
    .option('--state-dir <dir>', 'state root; renewal keeps its private state in <state>/link')
    .option('--host-id <id>', 'this host\'s id, from enroll (default: $AGENT_CONNECTORS_HOST_ID); without one only renewals run')
    .option('--once', 'renewals only: settle every due slot, then exit (for a timer); exit 1 if any did not settle')
    .option('--once-budget-ms <n>', 'with --once, how long retries may take', String(defaultFetchConfig.onceBudgetMs))
    .option('--backoff-cap-ms <n>', 'longest wait between renewal retries', String(defaultFetchConfig.backoff.capMs))
    .option('--renew-concurrency <n>', 'renewal requests in flight at once, each for a different slot', String(defaultFetchConfig.concurrency))
    .option('--link-backoff-base-ms <n>', 'first state-poll retry wait (full jitter, doubling)', String(defaultStatePollerConfig.backoff.baseMs))
    .option('--link-backoff-cap-ms <n>', 'longest wait between state-poll retries', String(defaultStatePollerConfig.backoff.capMs))
    .option('--poll-timeout-ms <n>', 'client timeout of one state long poll (the Gateway holds it ≤ 60 s)', String(defaultStatePollerConfig.pollTimeoutMs))
    .option('--credential-recheck-ms <n>', 'after a 401 or an unusable credential, how often it is read again', String(defaultStatePollerConfig.credentialRecheckMs))
    .option('--presence-interval-ms <n>', 'regular presence report (jittered ±10 %)', String(defaultPresenceConfig.intervalMs))
    .option('--forwarder-health <url>', "the forwarder's /healthz (loopback)", 'http://127.0.0.1:14323/healthz')
    .option('--cli-proxy-health <url>', "the cli-proxy's /healthz (loopback)", 'http://127.0.0.1:14324/healthz')
    .option('--audit-dir <dir>', 'the native_cli audit spool the cli-proxy writes (default: <state>/audit)')
    .option('--no-audit', 'do not upload native_cli audit events')
    .option('--audit-min-gap-ms <n>', 'least time between two audit uploads (a burst goes up as one batch)', String(defaultAuditUploadConfig.minGapMs))
    .addOption(logLevelOption());
}

/** `link` and `renew fetch`: renewals, plus the state poller and presence when enrolled. */
export async function runLink(opts: Record<string, string | boolean | undefined>): Promise<void> {
  const log = loggerFrom(opts);
  const layout = layoutFrom(opts);
  const gateway = (opts.gateway as string | undefined) ?? process.env.AGENT_CONNECTORS_GATEWAY_URL;
  if (!gateway) throw new ConfigError('--gateway (or $AGENT_CONNECTORS_GATEWAY_URL) is required');
  const gatewayUrl = parseOption(upstreamUrlSchema, gateway, '--gateway');
  const credentialPath = opts.credential
    ? resolve(opts.credential as string)
    : process.env.CREDENTIALS_DIRECTORY
      ? join(process.env.CREDENTIALS_DIRECTORY, 'host-credential')
      : undefined;
  if (!credentialPath) throw new ConfigError('--credential FILE is required outside systemd (no $CREDENTIALS_DIRECTORY)');
  const once = Boolean(opts.once);
  const metrics = metricsFrom(opts, 'link');
  if (metrics && once) throw new ConfigError('--metrics-listen is for the long-running link: --once exits before anything could scrape it');
  const adopted = await adoptOldPrivateState(layout);
  if (adopted) log.info({ from: adopted, to: layout.linkPrivate }, 'moved the private state of an older version to its new name');
  const services: Service[] = [
    createFetchService({
      ...defaultFetchConfig,
      gatewayUrl,
      credentialPath,
      handoffDir: layout.handoff,
      privateDir: layout.linkPrivate,
      once,
      onceBudgetMs: parseOption(positiveInt, opts.onceBudgetMs, '--once-budget-ms'),
      backoff: { ...defaultFetchConfig.backoff, capMs: parseOption(positiveInt, opts.backoffCapMs, '--backoff-cap-ms') },
      concurrency: parseOption(positiveInt, opts.renewConcurrency, '--renew-concurrency'),
      metrics: metrics && createRenewalMetrics(metrics.registry),
    }),
  ];
  if (metrics) services.push(metrics.service);
  const rawHostId = (opts.hostId as string | undefined) ?? process.env.AGENT_CONNECTORS_HOST_ID;
  if (once) {
    // --once keeps its meaning: renewals only.
  } else if (!rawHostId) {
    log.info('no host id ($AGENT_CONNECTORS_HOST_ID, --host-id): this host is not enrolled; running renewals only');
  } else {
    const hostId = parseOption(hostIdSchema, rawHostId, '--host-id');
    services.push(
      ...createLinkServices(
        {
          credentialPath,
          poller: {
            gatewayUrl,
            handoffDir: layout.handoff,
            pollTimeoutMs: parseOption(positiveInt, opts.pollTimeoutMs, '--poll-timeout-ms'),
            backoff: {
              baseMs: parseOption(positiveInt, opts.linkBackoffBaseMs, '--link-backoff-base-ms'),
              capMs: parseOption(positiveInt, opts.linkBackoffCapMs, '--link-backoff-cap-ms'),
            },
            credentialRecheckMs: parseOption(positiveInt, opts.credentialRecheckMs, '--credential-recheck-ms'),
            metrics: metrics && createLinkMetrics(metrics.registry),
          },
          presence: {
            ...defaultPresenceConfig,
            gatewayUrl,
            handoffDir: layout.handoff,
            hostId,
            version,
            intervalMs: parseOption(positiveInt, opts.presenceIntervalMs, '--presence-interval-ms'),
            health: {
              forwarder: parseOption(loopbackHttpUrl, opts.forwarderHealth, '--forwarder-health'),
              'cli-proxy': parseOption(loopbackHttpUrl, opts.cliProxyHealth, '--cli-proxy-health'),
            },
          },
          audit:
            opts.audit === false
              ? undefined
              : {
                  ...defaultAuditUploadConfig,
                  gatewayUrl,
                  dir: opts.auditDir ? resolve(opts.auditDir as string) : layout.audit,
                  backoff: {
                    baseMs: parseOption(positiveInt, opts.linkBackoffBaseMs, '--link-backoff-base-ms'),
                    capMs: parseOption(positiveInt, opts.linkBackoffCapMs, '--link-backoff-cap-ms'),
                  },
                  minGapMs: parseOption(positiveInt, opts.auditMinGapMs, '--audit-min-gap-ms'),
                  credentialRecheckMs: parseOption(positiveInt, opts.credentialRecheckMs, '--credential-recheck-ms'),
                },
        },
        log,
      ),
    );
  }
  await runServices(services, { log, notifier: createNotifier({ log }) });
}

/** Human lines for the person at the terminal; stdout, as `bind` prints its results. */
function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

export function registerLinkCommands(program: Command): void {
  addLinkOptions(
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
    .addHelpText('after', '\nThe pairing code is never an argument (every local user can read argv):\n  sudo agent-connectors enroll --gateway https://gw.example.com        (prompts)\n  sudo agent-connectors enroll --gateway https://gw.example.com < code.txt\nExit codes: 0 enrolled, 1 enrolment failed (the message says why and what to do), 2 usage.\n')
    .action(async (opts: { gateway: string; credential: string; force?: boolean; attempts: string }) => {
      const gatewayUrl = parseOption(upstreamUrlSchema, opts.gateway, '--gateway');
      await enroll({
        gatewayUrl,
        credentialPath: resolve(opts.credential),
        force: Boolean(opts.force),
        readCode: () => readPairingCode(),
        hostname: hostname(),
        version,
        attempts: parseOption(positiveInt, opts.attempts, '--attempts'),
        say,
      });
    });

  program
    .command('unenroll')
    .description('stop the link and remove the host credential; the host becomes operator-managed again')
    .option('--credential <file>', 'the host credential file enroll wrote', DEFAULT_CREDENTIAL_PATH)
    .action(async (opts: { credential: string }) => {
      await unenroll({ credentialPath: resolve(opts.credential), say });
    });
}
