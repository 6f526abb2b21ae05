import type { Logger } from '../log/logger.js';
import type { Service } from '../service/service.js';
import { createAuditUpload, type AuditUploadConfig } from './audit-upload.js';
import { LinkCredential } from './credential.js';
import { recordLinkStatus } from './link-status.js';
import { createPresence, type PresenceConfig } from './presence.js';
import { createStatePoller, type StatePollerConfig } from './state-poller.js';

export interface LinkConfig {
  credentialPath: string;
  poller: Omit<StatePollerConfig, 'onHandedOver' | 'onPoll'>;
  presence: PresenceConfig;
  /** The native_cli audit upload (SPEC §9); undefined: not run. */
  audit?: AuditUploadConfig | undefined;
}

/**
 * The link's own services (SPEC §8, §9), sharing one credential gate: the state poller,
 * presence and the audit upload. A state handed over makes presence report soon after. The renewal service runs
 * beside them in the same process (cli/link-commands.ts).
 */
export function createLinkServices(config: LinkConfig, log: Logger): Service[] {
  const credential = new LinkCredential(config.credentialPath, log.child({ part: 'link' }));
  const presence = createPresence(config.presence, credential);
  const onPoll = recordLinkStatus(config.poller.handoffDir, credential, log.child({ part: 'link' }));
  const poller = createStatePoller({ ...config.poller, onHandedOver: () => presence.changed(), onPoll }, credential);
  return config.audit ? [poller, presence.service, createAuditUpload(config.audit, credential)] : [poller, presence.service];
}
