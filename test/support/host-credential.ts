import type { Logger } from '../../src/log/logger.js';
import { GatewayClient } from '../../src/link/gateway-client.js';
import { HostCredential } from '../../src/link/host-credential.js';
import type { TapTest } from './tap.js';

/** A host credential read from `path`, sending to `gatewayUrl` through its own client (closed at teardown). */
export function hostCredential(t: TapTest, path: string, gatewayUrl: string, log: Logger): HostCredential {
  const client = new GatewayClient(gatewayUrl);
  t.teardown(() => client.close());
  return new HostCredential(path, client, log);
}
