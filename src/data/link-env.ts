import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/**
 * What `enroll` leaves beside the host credential, as read by doctor and status:
 * `link.env`, a systemd EnvironmentFile with the Gateway URL and the host id (no secret).
 * Whether the host is enrolled is whether the credential file exists (an lstat: it is
 * root's secret, and nothing but the link needs its content).
 */

export const LINK_ENV_GATEWAY = 'AGENT_CONNECTORS_GATEWAY_URL';
export const LINK_ENV_HOST_ID = 'AGENT_CONNECTORS_HOST_ID';

export interface LinkEnv {
  gatewayUrl?: string;
  hostId?: string;
}

export function linkEnvPath(credentialPath: string): string {
  return join(dirname(credentialPath), 'link.env');
}

export function parseLinkEnv(text: string): LinkEnv {
  const out: LinkEnv = {};
  for (const line of text.split('\n')) {
    const eq = line.indexOf('=');
    if (line.startsWith('#') || eq < 0) continue;
    const value = line.slice(eq + 1).trim();
    if (!value) continue;
    const key = line.slice(0, eq).trim();
    if (key === LINK_ENV_GATEWAY) out.gatewayUrl = value;
    else if (key === LINK_ENV_HOST_ID) out.hostId = value;
  }
  return out;
}

/** link.env beside the credential, or undefined when there is none. */
export async function readLinkEnv(credentialPath: string): Promise<LinkEnv | undefined> {
  const text = await readFile(linkEnvPath(credentialPath), 'utf8').catch(() => undefined);
  return text === undefined ? undefined : parseLinkEnv(text);
}
