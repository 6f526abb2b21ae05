import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { ConfigError } from '../errors.js';
import { upstreamUrlSchema } from '../data/fields.js';
import { hostIdSchema } from '../data/link-wire.js';
import { DEFAULT_CREDENTIAL_PATH, enroll, unenroll } from '../link/enroll.js';
import { defaultAuditUploadConfig } from '../link/audit-upload.js';
import { createLinkServices } from '../link/link.js';
import { readPairingCode } from '../link/pairing-code.js';
import { defaultPresenceConfig } from '../link/presence.js';
import { defaultStatePollerConfig } from '../link/state-poller.js';
import { defaultRenewalConfig } from '../link/renewal/renewal-service.js';
import { LINK_ENV_GATEWAY, LINK_ENV_HOST_ID, readLinkEnv } from '../data/link-env.js';
import type { BackoffOptions } from '../net/backoff.js';
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
    .option('--gateway <url>', 'Gateway base URL (default: $AGENT_CONNECTORS_GATEWAY_URL, else link.env beside --credential)')
    .option('--credential <file>', 'host credential file (default: $CREDENTIALS_DIRECTORY/host-credential)')
    .option('--handoff <dir>', 'hand-off directory (default: <state>/handoff)')
    .option('--state-dir <dir>', 'state root; renewal keeps its private state in <state>/renew-fetch')
    .option('--host-id <id>', 'this host\'s id, from enroll (default: $AGENT_CONNECTORS_HOST_ID, else link.env beside --credential); without one only renewals run')
    .option('--once', 'renewals only: settle every due slot, then exit (for a timer); exit 1 if any did not settle')
    .option('--once-budget-ms <n>', 'with --once, how long retries may take', String(defaultRenewalConfig.onceBudgetMs))
    .option('--backoff-cap-ms <n>', 'longest wait between renewal retries', String(defaultRenewalConfig.backoff.capMs))
    .option('--renew-concurrency <n>', 'renewal requests in flight at once, each for a different slot', String(defaultRenewalConfig.concurrency))
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

/** `link` and `renew fetch`: renewals, plus the state poller, presence and audit upload when enrolled. */
export async function runLink(opts: Record<string, string | boolean | undefined>): Promise<void> {
  const log = loggerFrom(opts);
  const layout = layoutFrom(opts);
  const credentialPath = opts.credential
    ? resolve(opts.credential as string)
    : process.env.CREDENTIALS_DIRECTORY
      ? join(process.env.CREDENTIALS_DIRECTORY, 'host-credential')
      : undefined;
  if (!credentialPath) throw new ConfigError('--credential FILE is required outside systemd (no $CREDENTIALS_DIRECTORY)');
  // What enroll wrote beside the credential; flags and the environment override it. Under
  // systemd the unit loads the same file into the environment (EnvironmentFile=).
  const enrolled = opts.credential ? await readLinkEnv(credentialPath) : undefined;
  const gateway = (opts.gateway as string | undefined) ?? process.env[LINK_ENV_GATEWAY] ?? enrolled?.gatewayUrl;
  if (!gateway) throw new ConfigError(`--gateway (or $${LINK_ENV_GATEWAY}, or link.env beside the credential) is required`);
  const gatewayUrl = parseOption(upstreamUrlSchema, gateway, '--gateway');
  const once = Boolean(opts.once);
  const metrics = metricsFrom(opts, 'link');
  if (metrics && once) throw new ConfigError('--metrics-listen is for the long-running link: --once exits before anything could scrape it');
  const rawHostId = (opts.hostId as string | undefined) ?? process.env[LINK_ENV_HOST_ID] ?? enrolled?.hostId;
  if (!once && !rawHostId) log.info(`no host id (--host-id, $${LINK_ENV_HOST_ID}, link.env): this host is not enrolled; running renewals only`);
  const linkBackoff = (): BackoffOptions => ({
    baseMs: parseOption(positiveInt, opts.linkBackoffBaseMs, '--link-backoff-base-ms'),
    capMs: parseOption(positiveInt, opts.linkBackoffCapMs, '--link-backoff-cap-ms'),
  });
  const credentialRecheckMs = parseOption(positiveInt, opts.credentialRecheckMs, '--credential-recheck-ms');
  const services: Service[] = createLinkServices(
    {
      gatewayUrl,
      credentialPath,
      renewal: {
        ...defaultRenewalConfig,
        handoffDir: layout.handoff,
        privateDir: layout.fetchPrivate,
        once,
        onceBudgetMs: parseOption(positiveInt, opts.onceBudgetMs, '--once-budget-ms'),
        backoff: { ...defaultRenewalConfig.backoff, capMs: parseOption(positiveInt, opts.backoffCapMs, '--backoff-cap-ms') },
        concurrency: parseOption(positiveInt, opts.renewConcurrency, '--renew-concurrency'),
        metrics: metrics && createRenewalMetrics(metrics.registry),
      },
      // --once keeps its meaning: renewals only.
      enrolled:
        once || !rawHostId
          ? undefined
          : {
              poller: {
                handoffDir: layout.handoff,
                pollTimeoutMs: parseOption(positiveInt, opts.pollTimeoutMs, '--poll-timeout-ms'),
                backoff: linkBackoff(),
                credentialRecheckMs,
                metrics: metrics && createLinkMetrics(metrics.registry),
              },
              presence: {
                ...defaultPresenceConfig,
                handoffDir: layout.handoff,
                hostId: parseOption(hostIdSchema, rawHostId, '--host-id'),
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
                      dir: opts.auditDir ? resolve(opts.auditDir as string) : layout.audit,
                      backoff: linkBackoff(),
                      minGapMs: parseOption(positiveInt, opts.auditMinGapMs, '--audit-min-gap-ms'),
                      credentialRecheckMs,
                    },
            },
    },
    log,
  );
  if (metrics) services.push(metrics.service);
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
