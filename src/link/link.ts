import { handoffPaths } from '../data/handoff.js';
import { writeHostRevoked } from '../data/host-revoked.js';
import { SlotCache } from '../data/slot-cache.js';
import type { Logger } from '../log/logger.js';
import type { Service } from '../service/service.js';
import { createAuditUpload, type AuditUploadConfig } from './audit-upload.js';
import { GatewayClient } from './gateway-client.js';
import { HostCredential } from './host-credential.js';
import { recordLinkStatus } from './link-status.js';
import { createPresence, type PresenceConfig } from './presence.js';
import { createRenewalService, type RenewalConfig } from './renewal/renewal-service.js';
import { createStatePoller, type StatePollerConfig } from './state-poller.js';

export interface LinkConfig {
  gatewayUrl: string;
  credentialPath: string;
  /** Besides root and the link's own user, who may own a plain-http loopback Gateway (`--loopback-owner-uids`). */
  loopbackOwnerUids?: ReadonlySet<number> | undefined;
  renewal: RenewalConfig;
  /** The state poll, presence and the audit upload: an enrolled host's (one with a host id). Undefined: renewals only. */
  enrolled?:
    | {
        poller: Omit<StatePollerConfig, 'onHandedOver' | 'onPoll'>;
        presence: PresenceConfig;
        /** The native_cli audit upload (SPEC §9); undefined: not run. */
        audit?: AuditUploadConfig | undefined;
      }
    | undefined;
}

/**
 * The link (SPEC §8, §9): every part that holds the host credential, built as one. They
 * share one Gateway client and one credential with one stop switch: renewal, and on an
 * enrolled host the state poller, presence and the audit upload. A state handed over makes
 * presence report soon after.
 */
export function createLinkServices(config: LinkConfig, log: Logger): Service[] {
  const linkLog = log.child({ part: 'link' });
  const client = new GatewayClient(config.gatewayUrl, { loopbackOwnerUids: config.loopbackOwnerUids, log: linkLog });
  const credential = new HostCredential(config.credentialPath, client, linkLog);
  let onPruned: () => void = () => undefined;
  const pruned = new Promise<void>((resolve) => (onPruned = resolve));
  // One SlotCache for renewal and presence: each slot file (and the slot manifest) is read
  // once per change, not once per reader (docs/host-link.md, session 12).
  const slotCache = new SlotCache(handoffPaths(config.renewal.handoffDir), config.renewal.maxSleepMs);
  const services = [createRenewalService(config.renewal, credential, { onPruned, slotCache })];
  const enrolled = config.enrolled;
  if (enrolled) {
    const presence = createPresence(enrolled.presence, credential, enrolled.presence.handoffDir === config.renewal.handoffDir ? { slotCache } : {});
    const onPoll = recordLinkStatus(enrolled.poller.handoffDir, credential, linkLog);
    services.push(createStatePoller({ ...enrolled.poller, onHandedOver: () => presence.changed(), onPoll, startAfter: pruned }, credential), presence.service);
    handOffRevocation(enrolled.poller.handoffDir, credential, linkLog);
    if (enrolled.audit) services.push(createAuditUpload(enrolled.audit, credential));
  }
  return closingAfterLast(client, services);
}

/**
 * A 401 to the host credential means the host was removed in the platform: the link halts
 * (it never polls with a dead credential) and hands apply the revocation, which deletes
 * every token file and shim (data/host-revoked.ts). The link writes no state itself.
 * Only an enrolled host: an operator-managed one keeps its files (and its tokens expire).
 */
function handOffRevocation(handoffDir: string, credential: HostCredential, log: Logger): void {
  credential.onChange(() => {
    if (!credential.halted) return;
    writeHostRevoked(handoffDir, 'gateway').then(
      (wrote) => wrote && log.warn('host revocation handed to apply: every token file and shim will be deleted'),
      (err: unknown) => log.error({ err: { message: (err as Error).message } }, 'could not hand the host revocation to apply; run: sudo agent-connectors unenroll'),
    );
  });
}

/** The client's connections close once the last part using it has stopped. */
function closingAfterLast(client: GatewayClient, services: Service[]): Service[] {
  let running = services.length;
  return services.map((svc) => ({
    name: svc.name,
    async run(ctx) {
      try {
        await svc.run(ctx);
      } finally {
        running -= 1;
        if (running === 0) await client.close();
      }
    },
  }));
}
