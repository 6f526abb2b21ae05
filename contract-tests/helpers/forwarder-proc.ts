/*
 * Kept for the tests not yet moved to test/support (renew-*, systemd-*, forwarder-process,
 * lab.ts, renew-harness.ts): the same module state (knownSecrets, allProcs) as test/support,
 * so a leak check sees every process whichever import started it.
 */
import type { TapTest } from '../../test/support/tap.js';
import { startProxy, type ProxyOptions, type ProxyProc } from '../../test/support/proxy-rig.js';

export {
  CLI,
  CliProc,
  REPO_ROOT,
  allProcs,
  checkNoLeaks,
  knownSecrets,
  leakedSecrets,
  startCli,
  writeJsonAtomic as writeInstances,
  writeToken,
  type LogLine,
} from '../../test/support/cli-proc.js';
export { tempDir } from '../../test/support/temp-dir.js';

export interface ForwarderProc extends ProxyProc {
  instancesPath: string;
}

export async function startForwarder(t: TapTest, opts: Omit<ProxyOptions, 'config'> = {}): Promise<ForwarderProc> {
  const proc = await startProxy(t, 'forwarder', opts);
  return Object.assign(proc, { instancesPath: proc.configPath });
}
