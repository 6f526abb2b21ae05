/** nginx and wrk: installed from Debian when missing (as root), else how to install them. */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { nginxBin, nginxVersion } from './nginx.js';
import { REPO_ROOT } from './paths.js';
import { run } from './proc.js';
import { wrkBin, wrkVersion } from './wrk.js';

export const INSTALL_HINT = 'apt-get update && apt-get install -y nginx-light wrk   (Debian 13: nginx instead of nginx-light)';

async function aptInstall(pkgs: string[], log: (s: string) => void): Promise<boolean> {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  let r = await run('apt-get', ['install', '-y', '--no-install-recommends', ...pkgs], { env });
  if (r.code !== 0) {
    log(`apt-get install ${pkgs.join(' ')} failed; running apt-get update first`);
    await run('apt-get', ['update'], { env });
    r = await run('apt-get', ['install', '-y', '--no-install-recommends', ...pkgs], { env });
  }
  return r.code === 0;
}

/** Installs what is missing when allowed and possible; returns what is available. */
export async function ensureTools(install: boolean, log: (s: string) => void): Promise<{ nginx: boolean; wrk: boolean }> {
  const missing = (): string[] => [...(nginxBin() ? [] : ['nginx']), ...(wrkBin() ? [] : ['wrk'])];
  if (missing().length && install) {
    if (process.getuid?.() !== 0 || !existsSync('/usr/bin/apt-get')) {
      log(`missing ${missing().join(', ')}; not root or no apt-get, so not installing. Install with:\n  ${INSTALL_HINT}`);
    } else {
      log(`installing ${missing().join(', ')} from Debian…`);
      // The service is never started by us: Debian's postinst may try to, which is harmless.
      for (const pkg of missing()) {
        const ok = pkg === 'nginx' ? (await aptInstall(['nginx-light'], log)) || (await aptInstall(['nginx'], log)) : await aptInstall([pkg], log);
        if (!ok) log(`could not install ${pkg}. Install with:\n  ${INSTALL_HINT}`);
      }
    }
  } else if (missing().length) {
    log(`missing ${missing().join(', ')} (--no-install). Install with:\n  ${INSTALL_HINT}`);
  }
  return { nginx: nginxBin() !== undefined, wrk: wrkBin() !== undefined };
}

export interface MachineInfo {
  date: string;
  cpuModel: string;
  cores: number;
  memGiB: number;
  kernel: string;
  os: string;
  node: string;
  nginx: string | undefined;
  wrk: string | undefined;
  loadAvgAtStart: number[];
  /** The commit the CLI was built from, and whether src/ had uncommitted changes. */
  commit: string | undefined;
  srcDirty: boolean | undefined;
}

function git(args: string[]): string | undefined {
  const r = spawnSync('git', args, { cwd: REPO_ROOT, encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

export function machineInfo(): MachineInfo {
  let os = 'Linux';
  try {
    os = /^PRETTY_NAME="?([^"\n]*)"?$/m.exec(readFileSync('/etc/os-release', 'utf8'))?.[1] ?? os;
  } catch {
    // keep the default
  }
  let kernel = '';
  try {
    kernel = readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim();
  } catch {
    // keep empty
  }
  return {
    date: new Date().toISOString(),
    cpuModel: cpus()[0]?.model ?? 'unknown',
    cores: cpus().length,
    memGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    kernel,
    os,
    node: process.version,
    nginx: nginxVersion(),
    wrk: wrkVersion(),
    loadAvgAtStart: loadavg().map((x) => Math.round(x * 100) / 100),
    commit: git(['rev-parse', '--short', 'HEAD']),
    srcDirty: ((d) => (d === undefined ? undefined : d.length > 0))(git(['status', '--porcelain', '--', 'src'])),
  };
}
