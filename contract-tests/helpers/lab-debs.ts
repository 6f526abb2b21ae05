import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../../test/support/cli-proc.js';
import { Lab, run } from '../../test/support/lab.js';
import type { TapTest } from '../../test/support/tap.js';
import { tempDir } from '../../test/support/temp-dir.js';

/**
 * What the package labs share: this checkout's package for this machine's architecture,
 * with its tarball, built once per test process (building runs npm ci and xz over the
 * carried runtime: minutes on a busy machine), and the stock Debian roots
 * (test/tools/debian-root.sh, cached between runs).
 */

export const CURRENT_VERSION = '0.1.0-lab2';
const BUILDER = join(REPO_ROOT, 'build/packaging/build.js');
const ROOT_SCRIPT = join(REPO_ROOT, 'test/tools/debian-root.sh');
/** npm ci, tsc-free, and two xz passes over ~135 MiB (the .deb, the tarball). */
export const BUILD_TIMEOUT_MS = 12 * 60_000;
/** mmdebstrap of a minbase root with systemd and nodejs: 13 min seen at a load of 16. */
export const ROOT_TIMEOUT_MS = 25 * 60_000;

export interface CurrentPackage {
  ok: boolean;
  log: string;
  deb: string;
  tarball: string;
  arch: string;
}

let current: Promise<CurrentPackage> | undefined;

/** The checkout's .deb and tarball for this machine (one build per process; the files stay until it exits). */
export function currentPackage(): Promise<CurrentPackage> {
  current ??= (async () => {
    const arch = (await run('dpkg', ['--print-architecture'])).stdout.trim();
    const out = tempDir('ac-lab-debs-');
    process.once('exit', () => rmSync(out, { recursive: true, force: true }));
    const r = await run(process.execPath, [BUILDER, '--arch', arch, '--version', CURRENT_VERSION, '--out', out, '--tarball', '--fast'], {
      env: { HOME: process.env.HOME ?? '/root' },
      timeoutMs: BUILD_TIMEOUT_MS,
    });
    const deb = join(out, `agent-connectors_${CURRENT_VERSION}_${arch}.deb`);
    const tarball = join(out, `agent-connectors_${CURRENT_VERSION}_${arch}.tar.gz`);
    const ok = r.code === 0 && existsSync(deb) && existsSync(tarball);
    return { ok, log: `${r.stdout}${r.stderr}${ok ? '' : `(${r.timedOut ? 'timed out' : `exit ${r.code}`})`}`, deb, tarball, arch };
  })();
  return current;
}

/** The cached stock root of `suite`, made first when missing; the error says why not. */
export async function debianRoot(suite: 'bookworm' | 'trixie'): Promise<{ root?: string; log: string }> {
  const started = Date.now();
  const r = await run('bash', [ROOT_SCRIPT, suite], { timeoutMs: ROOT_TIMEOUT_MS });
  const root = r.stdout.trim().split('\n').at(-1);
  const log = `${suite} root: ${root} (${Math.round((Date.now() - started) / 1000)} s)${r.code === 0 ? '' : `\n${r.stderr}(${r.timedOut ? 'timed out' : `exit ${r.code}`})`}`;
  return r.code === 0 && root && existsSync(join(root, 'lib/systemd/systemd')) ? { root, log } : { log };
}

/** Why the stock-root labs cannot run here (besides the lab's own reasons). */
export function debianRootSkipReason(): string | undefined {
  if (!existsSync('/usr/bin/mmdebstrap')) return 'the package labs make stock Debian roots with mmdebstrap (Debian: apt-get install mmdebstrap)';
  if (!existsSync('/usr/bin/dpkg-deb')) return 'building the package needs dpkg-deb (Debian: the dpkg package)';
  return undefined;
}

export interface PackageLabScratch {
  scratch: string;
  /** The lab's WORK directory: its /tmp is private, so what it must see lives here. */
  work: string;
  /** Under work: the packages, where dpkg inside can read them. */
  debs: string;
  /** The lab's unit path: links to where the package puts its units. */
  unitDir: string;
  /** Boots the lab on `root` (the teardown ends it, and on a failure shows its output and journal); fails the test when it cannot. */
  boot: (root: string, limitS: number) => Promise<Lab | undefined>;
}

/** The scratch directories of a package lab, removed at the end unless the test failed. */
export function packageLabScratch(t: TapTest, prefix: string): PackageLabScratch {
  const scratch = tempDir(prefix);
  const work = join(scratch, 'work');
  const debs = join(work, 'debs');
  const unitDir = join(scratch, 'units');
  mkdirSync(debs, { recursive: true });
  mkdirSync(unitDir);
  let lab: Lab | undefined;
  t.teardown(async () => {
    if (lab) {
      const journal = (await lab.exec('journalctl --no-pager -o short-monotonic -u "agent-connectors*"')).stdout;
      await lab.shutdown();
      if (!t.passing()) {
        t.comment(`---- lab script output ----\n${lab.output.join('\n')}`);
        t.comment(`---- journal (last 150 lines) ----\n${journal.split('\n').slice(-150).join('\n')}`);
      }
    }
    if (t.passing()) rmSync(scratch, { recursive: true, force: true });
    else t.comment(`scratch dir (kept): ${scratch}`);
  });
  const boot = async (root: string, limitS: number): Promise<Lab | undefined> => {
    try {
      lab = await Lab.boot({ unitDir, work, root, limitS });
      return lab;
    } catch (err) {
      t.fail((err as Error).message);
      return undefined;
    }
  };
  return { scratch, work, debs, unitDir, boot };
}
