import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { checkWith, recordMinted } from '../contract-tests/helpers/lab-run.js';
import { McpUpstream } from '../contract-tests/helpers/mcp-upstream.js';
import { FORWARDER_PORT, Lab, labSkipReason, run } from '../test/support/lab.js';
import { MockRenewGateway } from '../test/support/mock-renew-gateway.js';

/**
 * The installed package as a target of the release gates: the .deb `npm run package`
 * builds, installed with dpkg into the systemd lab (writable overlays of /etc, /usr and the
 * dpkg database: the host is never changed), one binding served by the packaged units with
 * tokens the packaged renewal fetched. The agents run on the host, whose loopback the lab
 * shares, as root (always among the peers the proxies serve).
 */

const INSTANCE = 'gates';
const TARGET_UNIT = 'agent-connectors.target';
const STATE = '/var/lib/agent-connectors';

export interface LabTarget {
  url: string;
  base: string;
  bindingId: string;
  /** `agent-connectors <args>` run by the installed package, inside the lab. */
  cli: (args: readonly string[]) => Promise<string>;
  secrets: () => string[];
  /** A directory holding the host's secrets, for the secret search's self-check. */
  secretsDir: string;
  stop: () => Promise<void>;
}

export function labTargetSkipReason(): string | undefined {
  const lab = labSkipReason();
  if (lab) return lab;
  if (!existsSync('/usr/bin/dpkg') || !existsSync('/usr/bin/dpkg-deb')) return 'the lab target needs dpkg and dpkg-deb';
  if (!/\boverlay\b/.test(readFileSync('/proc/filesystems', 'utf8'))) return 'the lab target needs overlayfs';
  return undefined;
}

export async function startLabTarget(work: string, repoRoot: string, log: (line: string) => void): Promise<LabTarget> {
  const labWork = join(work, 'lab');
  const debs = join(labWork, 'debs');
  const unitDir = join(work, 'lab-units');
  mkdirSync(debs, { recursive: true });
  mkdirSync(unitDir, { recursive: true });
  const version = '0.0.0-gates';
  log('lab: building the .deb (npm run package)');
  // This machine's architecture: the package carries its Node (docs/packaging.md).
  const arch = (await run('dpkg', ['--print-architecture'])).stdout.trim();
  const built = await run(process.execPath, [join(repoRoot, 'build/packaging/build.js'), '--arch', arch, '--version', version, '--out', debs, '--fast'], {
    env: { HOME: process.env.HOME ?? '/root' },
    timeoutMs: 10 * 60_000,
  });
  const deb = join(debs, `agent-connectors_${version}_${arch}.deb`);
  if (built.code !== 0 || !existsSync(deb)) throw new Error(`building the .deb failed (exit ${built.code}):\n${built.stdout}${built.stderr}`);
  const listing = await run('dpkg-deb', ['-c', deb]);
  for (const m of listing.stdout.matchAll(/ \.\/usr\/lib\/systemd\/system\/(\S+)$/gm)) symlinkSync(`/usr/lib/systemd/system/${m[1]}`, join(unitDir, m[1]!));

  const credential = `hostcred-${randomBytes(24).toString('base64url')}`;
  const gw = await MockRenewGateway.start({ credential, tokenLifetimeMs: 30 * 60_000, slots: [`instance:${INSTANCE}`] });
  const minted = recordMinted(gw.authority);
  const upstream = await McpUpstream.start({ tools: ['echo'], check: checkWith(gw.authority, minted) });
  const closeHostSide = async (): Promise<void> => {
    await upstream.close();
    await gw.close();
  };
  let lab: Lab;
  try {
    lab = await Lab.boot({ unitDir, work: labWork, overlay: true, limitS: 40 * 60 });
  } catch (err) {
    await closeHostSide();
    throw err;
  }
  try {
    // No nodejs to satisfy: the package carries its Node.
    log(`lab: dpkg -i ${deb.split('/').at(-1)}`);
    await lab.sh(`dpkg -i ${deb} 2>&1`, 180_000);
    const bindingId = `gates_${randomBytes(12).toString('base64url')}`;
    await lab.sh(`agent-connectors bind ${bindingId} --instance-id ${INSTANCE} --upstream ${upstream.url()}`);
    // The credential goes through a 0600 file the lab sees (its WORK directory), never
    // through a command line.
    const credentialFile = join(labWork, 'host-credential');
    writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
    await lab.sh(
      `install -m 600 ${credentialFile} /etc/agent-connectors/host-credential && rm -f ${credentialFile} && ` +
        `printf 'AGENT_CONNECTORS_GATEWAY_URL=%s\\n' '${gw.url}' > /etc/agent-connectors/link.env`,
    );
    await lab.sh(`systemctl enable --now ${TARGET_UNIT} 2>&1`);
    await lab.sh(`until [ -s ${STATE}/mcp-forwarder/${INSTANCE}.token ]; do sleep 0.2; done`, 60_000);
    log('lab: the packaged units serve the binding with a renewed token');
    // The self-check of the secret search needs the secrets on a disk it can read.
    const secretsDir = join(work, 'lab-secrets');
    mkdirSync(secretsDir, { mode: 0o700 });
    const secrets = (): string[] => [credential, ...minted];
    const base = `http://127.0.0.1:${FORWARDER_PORT}`;
    const l = lab;
    return {
      url: `${base}/i/${bindingId}/mcp`,
      base,
      bindingId,
      cli: async (args) => (await l.sh(`agent-connectors ${args.join(' ')}`)).trim(),
      secrets: () => {
        writeFileSync(join(secretsDir, 'held'), secrets().join('\n'), { mode: 0o600 });
        return secrets();
      },
      secretsDir,
      stop: async () => {
        await l.exec(`systemctl stop ${TARGET_UNIT}`);
        await l.shutdown();
        await closeHostSide();
      },
    };
  } catch (err) {
    const journal = (await lab.exec('journalctl --no-pager -o cat -u "agent-connectors*" | tail -40')).stdout;
    await lab.shutdown();
    await closeHostSide();
    throw new Error(`${(err as Error).message}\n${journal}`);
  }
}
