import { copyFileSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../../test/support/cli-proc.js';
import { Lab, labSkipReason, run } from '../../test/support/lab.js';
import type { TapTest } from '../../test/support/tap.js';
import { tempDir } from '../../test/support/temp-dir.js';

/**
 * What the package labs share: this checkout's package for this machine's architecture,
 * with its tarball, built once per test process (building runs npm ci and xz over the
 * carried runtime: minutes on a busy machine), the previous release's package (built from
 * git once per machine: it never changes), and the stock Debian roots
 * (test/tools/debian-root.sh, cached between runs). Each is one promise per process, so
 * `prepareLabPackages` can start them while the first labs run and the package labs then
 * wait only for what is not ready yet.
 */

export const CURRENT_VERSION = '0.1.0-lab2';
/** The release before the link got its name (0.1.0): the upgrade lab (labs/deb.ts) starts from it. */
export const PREVIOUS_COMMIT = '4f2567f';
export const PREVIOUS_VERSION = '0.1.0-lab1';
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

/**
 * Builds run under `nice`: started early, they share the machine with labs whose units
 * must answer their watchdogs and tests that time renewals, and those come first.
 */
const NICE = ['nice', '-n', '10'] as const;

/** The checkout's .deb and tarball for this machine (one build per process; the files stay until it exits). */
export function currentPackage(): Promise<CurrentPackage> {
  current ??= (async () => {
    const arch = (await run('dpkg', ['--print-architecture'])).stdout.trim();
    const out = tempDir('ac-lab-debs-');
    process.once('exit', () => rmSync(out, { recursive: true, force: true }));
    const r = await run(NICE[0], [...NICE.slice(1), process.execPath, BUILDER, '--arch', arch, '--version', CURRENT_VERSION, '--out', out, '--tarball', '--fast'], {
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

/**
 * Where the machine keeps what the package labs make once: the stock roots and the previous
 * release's package. `run` gives test/tools/debian-root.sh a clean environment, so of the
 * variables it reads only this one is passed on (debianRoot), and XDG_CACHE_HOME never is.
 */
const CACHE_VARIABLE = 'AGENT_CONNECTORS_ROOT_CACHE';
function labCache(): string {
  return process.env[CACHE_VARIABLE] || '/var/cache/agent-connectors-lab';
}

export interface PreviousPackage {
  ok: boolean;
  log: string;
  /** The cached .deb; copy it where a lab can read it. */
  deb: string;
}

let previous: Promise<PreviousPackage> | undefined;

/**
 * The previous release's .deb (Architecture: all), as its own checkout would build it:
 * its tree from git (PREVIOUS_COMMIT), its own dependencies from its own lockfile (`npm
 * ci`: this checkout's differ, 0.1.0 still had chokidar), its dist/ and its
 * packaging/build.ts compiled with its own tsc, then its builder run. Nothing of it changes
 * from one run to the next, so it is kept in the lab cache under its commit and version,
 * renamed into place whole: a machine builds it once (about a minute when the machine is busy).
 */
export function previousPackage(): Promise<PreviousPackage> {
  previous ??= (async () => {
    const name = `agent-connectors_${PREVIOUS_VERSION}_all.deb`;
    const dir = join(labCache(), `previous-${PREVIOUS_COMMIT}`);
    const deb = join(dir, name);
    if (existsSync(deb) && (await run('dpkg-deb', ['-f', deb, 'Version'])).stdout.trim() === PREVIOUS_VERSION) {
      return { ok: true, log: `${name}: from the lab cache (${deb})`, deb };
    }
    const scratch = tempDir('ac-lab-previous-');
    process.once('exit', () => rmSync(scratch, { recursive: true, force: true }));
    const tree = join(scratch, 'tree');
    const out = join(scratch, 'out');
    mkdirSync(tree);
    const tar = join(scratch, 'previous.tar');
    const tsc = join(tree, 'node_modules/typescript/bin/tsc');
    const steps: Array<[string, string[]]> = [
      ['git', ['-C', REPO_ROOT, 'archive', '--output', tar, PREVIOUS_COMMIT]],
      ['tar', ['-xf', tar, '-C', tree]],
      ['npm', ['ci', '--ignore-scripts', '--prefer-offline', '--no-audit', '--no-fund']],
      [process.execPath, [tsc, '-p', join(tree, 'tsconfig.json')]],
      ['chmod', ['+x', join(tree, 'dist/cli.js')]],
      [process.execPath, [tsc, '-p', join(tree, 'tsconfig.builder.json')]],
      [process.execPath, [join(tree, 'build/packaging/build.js'), '--version', PREVIOUS_VERSION, '--out', out]],
    ];
    let log = '';
    for (const [file, args] of steps) {
      // Only the builder and what it imports, not the whole test tree.
      if (file === 'npm') writeFileSync(join(tree, 'tsconfig.builder.json'), JSON.stringify({ extends: './tsconfig.base.json', compilerOptions: { rootDir: '.', outDir: 'build' }, files: ['packaging/build.ts'] }));
      const r = await run(NICE[0], [...NICE.slice(1), file, ...args], { env: { HOME: process.env.HOME ?? '/root' }, timeoutMs: BUILD_TIMEOUT_MS, cwd: tree });
      log += `$ ${file} ${args.join(' ')}\n${r.stdout}${r.stderr}`;
      if (r.code !== 0) return { ok: false, log: `${log}(${r.timedOut ? 'timed out' : `exit ${r.code}`})`, deb };
    }
    if (!existsSync(join(out, name))) return { ok: false, log: `${log}(no ${name} in ${out})`, deb };
    // Copied beside its final place, then renamed: a reader sees the whole file or none.
    mkdirSync(dir, { recursive: true });
    const partial = join(dir, `.${name}.${process.pid}`);
    copyFileSync(join(out, name), partial);
    renameSync(partial, deb);
    return { ok: true, log: `${log}${name}: built, kept in the lab cache (${deb})`, deb };
  })();
  return previous;
}

const roots = new Map<string, Promise<{ root?: string; log: string }>>();

/** The cached stock root of `suite`, made first when missing; the error says why not. */
export function debianRoot(suite: 'bookworm' | 'trixie'): Promise<{ root?: string; log: string }> {
  let made = roots.get(suite);
  if (!made) {
    made = (async () => {
      const started = Date.now();
      const r = await run('bash', [ROOT_SCRIPT, suite], { timeoutMs: ROOT_TIMEOUT_MS, env: { [CACHE_VARIABLE]: labCache() } });
      const root = r.stdout.trim().split('\n').at(-1);
      const log = `${suite} root: ${root} (${Math.round((Date.now() - started) / 1000)} s)${r.code === 0 ? '' : `\n${r.stderr}(${r.timedOut ? 'timed out' : `exit ${r.code}`})`}`;
      return r.code === 0 && root && existsSync(join(root, 'lib/systemd/systemd')) ? { root, log } : { log };
    })();
    roots.set(suite, made);
  }
  return made;
}

/** Why the stock-root labs cannot run here (besides the lab's own reasons). */
export function debianRootSkipReason(): string | undefined {
  if (!existsSync('/usr/bin/mmdebstrap')) return 'the package labs make stock Debian roots with mmdebstrap (Debian: apt-get install mmdebstrap)';
  if (!existsSync('/usr/bin/dpkg-deb')) return 'building the package needs dpkg-deb (Debian: the dpkg package)';
  return undefined;
}

/** Why the upgrade lab cannot build the previous release here. */
export function previousPackageSkipReason(): string | undefined {
  if (!existsSync(join(REPO_ROOT, '.git'))) return `the upgrade from the previous release builds it from git (${PREVIOUS_COMMIT}); this checkout has no .git`;
  return undefined;
}

/**
 * Starts, one after the other, everything the package labs need: this checkout's package,
 * the previous release's, the trixie and bookworm roots. The lab scenarios run in turn in
 * one test file (contract-tests/0-systemd-labs.test.ts), and the first two boot labs that
 * mostly wait (renewals, restarts): building meanwhile takes the builds, over a minute and
 * a half on the test VM, off the file's time. One at a time, as the labs would: two builds
 * at once on a busy two-core machine ran each past its timeout. Each lab still awaits what
 * it needs itself (the same promises), so a lab run alone builds as before.
 */
export function prepareLabPackages(): void {
  if (labSkipReason() ?? debianRootSkipReason()) return;
  void (async () => {
    await currentPackage();
    if (!previousPackageSkipReason()) await previousPackage();
    await debianRoot('trixie');
    await debianRoot('bookworm');
  })().catch(() => undefined);
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
