import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { AGENT_USERS_FILE } from '../data/agent-users.js';
import { upstreamUrlSchema } from '../data/fields.js';
import { handoffPaths } from '../data/handoff.js';
import { LINK_ENV_GATEWAY, LINK_ENV_HOST_ID, readLinkEnv } from '../data/link-env.js';
import { hostIdSchema } from '../data/link-wire.js';
import { type StateLayout } from '../data/state-layout.js';
import { defaultAuditUploadConfig } from '../link/audit-upload.js';
import type { LinkConfig } from '../link/link.js';
import { defaultPresenceConfig } from '../link/presence.js';
import { defaultRenewalConfig } from '../link/renewal/renewal-service.js';
import { defaultStatePollerConfig } from '../link/state-poller.js';
import { version } from '../version.js';
import type { PartsConfig } from './build-parts.js';
import { DEFAULT_CLI_PROXY_LISTEN, DEFAULT_FORWARDER_LISTEN } from './defaults.js';
import { addMetricsFlag } from './metrics-flag.js';
import { layoutFrom, logLevelOption, LOOPBACK_OWNER_HELP, loopbackHttpUrl, loopbackOwnerUids, OptionErrors, positiveInt } from './options.js';
import { metricsTarget, str, type Opts } from './part-flags.js';


export function addLinkFlags(cmd: Command): Command {
  return addMetricsFlag(cmd)
    .option('--gateway <url>', `Gateway base URL (default: $${LINK_ENV_GATEWAY}, else link.env beside --credential)`)
    .option('--credential <file>', 'host credential file (default: $CREDENTIALS_DIRECTORY/host-credential)')
    .option('--handoff <dir>', 'hand-off directory (default: <state>/handoff)')
    .option('--state-dir <dir>', 'state root; the link keeps its private state in <state>/link')
    .option('--host-id <id>', `this host's id, from enroll (default: $${LINK_ENV_HOST_ID}, else link.env beside --credential); without one only renewals run`)
    .option('--once', 'renewals only: settle every due slot, then exit (for a timer); exit 1 if any did not settle')
    .option('--once-budget-ms <n>', 'with --once, how long retries may take', String(defaultRenewalConfig.onceBudgetMs))
    .option('--backoff-cap-ms <n>', 'longest wait between renewal retries', String(defaultRenewalConfig.backoff.capMs))
    .option('--renew-concurrency <n>', 'most renewal requests in flight at once, each for a different slot (lowered while the Gateway sheds load)', String(defaultRenewalConfig.concurrency))
    .option('--link-backoff-base-ms <n>', 'first state-poll retry wait (full jitter, doubling)', String(defaultStatePollerConfig.backoff.baseMs))
    .option('--link-backoff-cap-ms <n>', 'longest wait between state-poll retries', String(defaultStatePollerConfig.backoff.capMs))
    .option('--poll-timeout-ms <n>', 'client timeout of one state long poll (the Gateway holds it ≤ 60 s)', String(defaultStatePollerConfig.pollTimeoutMs))
    .option('--credential-recheck-ms <n>', 'after a 401 or an unusable credential, how often it is read again', String(defaultStatePollerConfig.credentialRecheckMs))
    .option('--presence-interval-ms <n>', 'regular presence report (jittered ±10 %)', String(defaultPresenceConfig.intervalMs))
    .option('--presence-timeout-ms <n>', "client timeout of one presence report (the Gateway's answer); a report not answered in time is retried at the next tick", String(defaultPresenceConfig.requestTimeoutMs))
    .option('--forwarder-health <url>', "the forwarder's /healthz (loopback)", `http://${DEFAULT_FORWARDER_LISTEN}/healthz`)
    .option('--cli-proxy-health <url>', "the cli-proxy's /healthz (loopback)", `http://${DEFAULT_CLI_PROXY_LISTEN}/healthz`)
    .option('--agent-users-file <file>', "the proxies' agent-users file: missing or empty (every agent refused) is a presence problem", AGENT_USERS_FILE)
    .option('--audit-dir <dir>', 'the native_cli audit spool the cli-proxy writes (default: <state>/audit)')
    .option('--no-audit', 'do not upload native_cli audit events')
    .option('--audit-min-gap-ms <n>', 'least time between two audit uploads (a burst goes up as one batch)', String(defaultAuditUploadConfig.minGapMs))
    .option('--loopback-owner-uids <list>', LOOPBACK_OWNER_HELP)
    .addOption(logLevelOption());
}

/** What a link needs beyond its flags: where it keeps state and whom it is. */
export interface LinkIdentity {
  gatewayUrl: string;
  credentialPath: string;
  /** Undefined: not enrolled (or `--once`), renewals only. */
  hostId: string | undefined;
  layout: StateLayout;
  auditDir?: string | undefined;
}

/** The link's config with every default (dev, tests): `identity` is all that differs. */
export function linkConfig(identity: LinkIdentity, tuning: Partial<LinkTuning> = {}): LinkConfig {
  const t = { ...defaultLinkTuning, ...tuning };
  const { layout } = identity;
  const handoffDir = handoffPaths(layout.handoff).root;
  return {
    gatewayUrl: identity.gatewayUrl,
    credentialPath: identity.credentialPath,
    loopbackOwnerUids: t.loopbackOwnerUids,
    renewal: {
      ...defaultRenewalConfig,
      handoffDir,
      privateDir: layout.linkPrivate,
      once: t.once,
      onceBudgetMs: t.onceBudgetMs,
      backoff: { ...defaultRenewalConfig.backoff, capMs: t.backoffCapMs },
      concurrency: t.renewConcurrency,
    },
    enrolled:
      t.once || identity.hostId === undefined
        ? undefined
        : {
            poller: { handoffDir, pollTimeoutMs: t.pollTimeoutMs, backoff: t.linkBackoff, credentialRecheckMs: t.credentialRecheckMs },
            presence: {
              ...defaultPresenceConfig,
              handoffDir,
              hostId: identity.hostId,
              version,
              intervalMs: t.presenceIntervalMs,
              requestTimeoutMs: t.presenceTimeoutMs,
              health: t.health,
              agentUsersFile: t.agentUsersFile,
            },
            audit: t.audit
              ? { ...defaultAuditUploadConfig, dir: identity.auditDir ?? layout.audit, backoff: t.linkBackoff, minGapMs: t.auditMinGapMs, credentialRecheckMs: t.credentialRecheckMs }
              : undefined,
          },
  };
}

/** The link's tunables: its flags, each default set here once. */
export interface LinkTuning {
  once: boolean;
  onceBudgetMs: number;
  backoffCapMs: number;
  renewConcurrency: number;
  linkBackoff: { baseMs: number; capMs: number };
  pollTimeoutMs: number;
  credentialRecheckMs: number;
  presenceIntervalMs: number;
  presenceTimeoutMs: number;
  health: Record<string, string>;
  /** The proxies' agent-users file, checked for presence; undefined (dev): not checked. */
  agentUsersFile: string | undefined;
  audit: boolean;
  auditMinGapMs: number;
  loopbackOwnerUids?: ReadonlySet<number> | undefined;
}

export const defaultLinkTuning: LinkTuning = {
  once: false,
  onceBudgetMs: defaultRenewalConfig.onceBudgetMs,
  backoffCapMs: defaultRenewalConfig.backoff.capMs,
  renewConcurrency: defaultRenewalConfig.concurrency,
  linkBackoff: defaultStatePollerConfig.backoff,
  pollTimeoutMs: defaultStatePollerConfig.pollTimeoutMs,
  credentialRecheckMs: defaultStatePollerConfig.credentialRecheckMs,
  presenceIntervalMs: defaultPresenceConfig.intervalMs,
  presenceTimeoutMs: defaultPresenceConfig.requestTimeoutMs,
  health: { forwarder: `http://${DEFAULT_FORWARDER_LISTEN}/healthz`, 'cli-proxy': `http://${DEFAULT_CLI_PROXY_LISTEN}/healthz` },
  agentUsersFile: undefined,
  audit: true,
  auditMinGapMs: defaultAuditUploadConfig.minGapMs,
};

/**
 * `link` and `renew fetch`. It needs nothing that enroll already wrote (SPEC §8): given
 * the credential file, the Gateway URL and host id come from link.env beside it; the
 * environment (the unit's EnvironmentFile= loads that same file) and flags override.
 */
export async function linkPartsFrom(opts: Opts, env: NodeJS.ProcessEnv = process.env): Promise<{ parts: PartsConfig; enrolled: boolean }> {
  const errors = new OptionErrors();
  const layout = layoutFrom(opts);
  const credentialPath = str(opts.credential)
    ? resolve(str(opts.credential) as string)
    : env.CREDENTIALS_DIRECTORY
      ? join(env.CREDENTIALS_DIRECTORY, 'host-credential')
      : undefined;
  if (!credentialPath) errors.add('--credential FILE is required outside systemd (no $CREDENTIALS_DIRECTORY)');
  const written = str(opts.credential) && credentialPath ? await readLinkEnv(credentialPath) : undefined;
  const gateway = str(opts.gateway) ?? env[LINK_ENV_GATEWAY] ?? written?.gatewayUrl;
  if (!gateway) errors.add(`--gateway (or $${LINK_ENV_GATEWAY}, or link.env beside the credential) is required`);
  const gatewayUrl = gateway === undefined ? '' : errors.parse(upstreamUrlSchema, gateway, '--gateway', '');
  const once = Boolean(opts.once);
  const metrics = metricsTarget(opts, errors);
  if (metrics && once) errors.add('--metrics-listen is for the long-running link: --once exits before anything could scrape it');
  const rawHostId = str(opts.hostId) ?? env[LINK_ENV_HOST_ID] ?? written?.hostId;
  const hostId = rawHostId === undefined ? undefined : errors.parse(hostIdSchema, rawHostId, '--host-id', undefined);
  const int = (flag: string, value: unknown, fallback: number): number => errors.parse(positiveInt, value, flag, fallback);
  const d = defaultLinkTuning;
  const linkBackoff = { baseMs: int('--link-backoff-base-ms', opts.linkBackoffBaseMs, d.linkBackoff.baseMs), capMs: int('--link-backoff-cap-ms', opts.linkBackoffCapMs, d.linkBackoff.capMs) };
  const tuning: LinkTuning = {
    once,
    onceBudgetMs: int('--once-budget-ms', opts.onceBudgetMs, d.onceBudgetMs),
    backoffCapMs: int('--backoff-cap-ms', opts.backoffCapMs, d.backoffCapMs),
    renewConcurrency: int('--renew-concurrency', opts.renewConcurrency, d.renewConcurrency),
    linkBackoff,
    pollTimeoutMs: int('--poll-timeout-ms', opts.pollTimeoutMs, d.pollTimeoutMs),
    credentialRecheckMs: int('--credential-recheck-ms', opts.credentialRecheckMs, d.credentialRecheckMs),
    presenceIntervalMs: int('--presence-interval-ms', opts.presenceIntervalMs, d.presenceIntervalMs),
    presenceTimeoutMs: int('--presence-timeout-ms', opts.presenceTimeoutMs, d.presenceTimeoutMs),
    health: {
      forwarder: errors.parse(loopbackHttpUrl, opts.forwarderHealth, '--forwarder-health', ''),
      'cli-proxy': errors.parse(loopbackHttpUrl, opts.cliProxyHealth, '--cli-proxy-health', ''),
    },
    agentUsersFile: str(opts.agentUsersFile) ? resolve(str(opts.agentUsersFile) as string) : undefined,
    audit: opts.audit !== false,
    auditMinGapMs: int('--audit-min-gap-ms', opts.auditMinGapMs, d.auditMinGapMs),
    loopbackOwnerUids: loopbackOwnerUids(opts, errors),
  };
  errors.done();
  const link = linkConfig(
    { gatewayUrl, credentialPath: credentialPath ?? '', hostId, layout, auditDir: str(opts.auditDir) ? resolve(str(opts.auditDir) as string) : undefined },
    tuning,
  );
  return { parts: { link, metrics }, enrolled: link.enrolled !== undefined };
}

