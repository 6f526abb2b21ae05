import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import { dirname, join, sep } from 'node:path';
import t from 'tap';
import { CLI, REPO_ROOT } from '../support/cli-proc.js';
import { run } from '../support/lab.js';
import { tempDir } from '../support/temp-dir.js';

/**
 * `install` from this checkout, into a scratch root outside it, and the copy run on its own:
 * the production packages are there, the dev-only ones (from the lockfile) are not, and the
 * installed CLI and every module of its dist/ load from the copy alone. The scratch root is
 * under the OS temp dir: Node looks for packages in node_modules of every folder above a
 * module, so a copy inside the checkout would find the checkout's.
 */

interface Lock {
  packages: Record<string, { dev?: boolean }>;
}
interface PackageJson {
  version: string;
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
}

const LOCK = JSON.parse(readFileSync(join(REPO_ROOT, 'package-lock.json'), 'utf8')) as Lock;
const PKG = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as PackageJson;
const PACKAGES = Object.entries(LOCK.packages).filter(([folder]) => folder.startsWith('node_modules/'));
const DEV_ONLY = PACKAGES.filter(([, e]) => e.dev === true).map(([folder]) => folder);
const PRODUCTION = PACKAGES.filter(([, e]) => e.dev !== true).map(([folder]) => folder);
/** The checkout's node_modules as it is on disk (a worktree's may be a link to another's). */
const CHECKOUT_MODULES = realpathSync(join(REPO_ROOT, 'node_modules'));

/** Every symlink under `root`, with its target resolved (undefined: it dangles). */
function linksUnder(root: string): Array<{ path: string; resolved: string | undefined }> {
  const out: Array<{ path: string; resolved: string | undefined }> = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isSymbolicLink()) out.push({ path: p.slice(root.length + 1), resolved: existsSync(p) ? realpathSync(p) : undefined });
      else if (e.isDirectory()) walk(p);
    }
  };
  walk(root);
  return out;
}

/** Imports each package named, then every module of dist/ but the CLI's entry (which runs main). */
const LOAD_ALL = `
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
const [lib, deps] = [process.argv[1], JSON.parse(process.argv[2])];
for (const d of deps) await import(d);
const files = readdirSync(join(lib, 'dist'), { recursive: true }).filter((f) => f.endsWith('.js') && f !== 'cli.js');
for (const f of files) await import(pathToFileURL(join(lib, 'dist', f)).href);
process.stdout.write(\`loaded \${deps.length} packages, \${files.length} modules\\n\`);
`;

t.test('install from the checkout copies the production packages only, and the copy runs on its own', async (t) => {
  const root = tempDir('ac-install-checkout-', t);
  const libDir = join(root, 'usr/local/lib/agent-connectors');
  const above: string[] = [];
  for (let dir = dirname(libDir); ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'node_modules'))) above.push(join(dir, 'node_modules'));
    if (dir === dirname(dir)) break;
  }
  t.same(above, [], 'no node_modules above the installed package that Node could fall back on (else this test proves nothing)');
  t.notOk(`${libDir}${sep}`.startsWith(`${REPO_ROOT}${sep}`), 'the scratch root is outside the checkout');

  t.ok(DEV_ONLY.length > 0, `the lockfile marks ${DEV_ONLY.length} packages dev-only`);
  const devDeps = Object.keys(PKG.devDependencies);
  t.same(devDeps.filter((d) => !DEV_ONLY.includes(`node_modules/${d}`)), [], `among them each devDependency of package.json (${devDeps.join(', ')})`);

  const r = await run(process.execPath, [CLI, 'install', '--root', root, '--no-activate', '--node', process.execPath], { timeoutMs: 120_000, cwd: root });
  t.equal(r.code, 0, `install exits 0${r.code === 0 ? '' : `: ${r.stderr}`}`);

  t.same(DEV_ONLY.filter((folder) => existsSync(join(libDir, folder))), [], 'no dev-only package is copied, nested ones included');
  const deps = Object.keys(PKG.dependencies);
  t.same(deps.filter((d) => !existsSync(join(libDir, 'node_modules', d, 'package.json'))), [], `each dependency of package.json is copied (${deps.join(', ')})`);
  const inCheckout = PRODUCTION.filter((folder) => existsSync(join(CHECKOUT_MODULES, folder.slice('node_modules/'.length))));
  t.same(inCheckout.filter((folder) => !existsSync(join(libDir, folder))), [], `so is every other production package the checkout has (${inCheckout.length})`);

  const links = linksUnder(libDir);
  t.ok(links.some((l) => l.path.startsWith('node_modules/.bin/')), 'node_modules/.bin keeps the links of production packages');
  t.same(links.filter((l) => l.resolved === undefined).map((l) => l.path), [], 'no link dangles (a .bin link into a dev-only package is left out)');
  t.same(links.filter((l) => l.resolved !== undefined && !l.resolved.startsWith(`${libDir}${sep}`)).map((l) => `${l.path} -> ${l.resolved}`), [], 'and none leads out of the copy, into the checkout');

  // The copy alone: a clean environment (run's env -i), started from the scratch root.
  const version = await run(process.execPath, [join(libDir, 'dist/cli.js'), '--version'], { cwd: root });
  t.equal(version.stdout, `${PKG.version}\n`, `the copied CLI runs: --version${version.code === 0 ? '' : `: ${version.stderr}`}`);
  const help = await run(process.execPath, [join(libDir, 'dist/cli.js'), '--help'], { cwd: root });
  t.equal(help.code, 0, `--help, which loads every command group (commander, execa, pino, undici, zod)${help.code === 0 ? '' : `: ${help.stderr}`}`);
  t.match(help.stdout, /forwarder/, 'and lists the commands');
  // Some packages load only when a command runs (prom-client with metrics, pkijs with a TLS
  // provider, @smithy with AWS signing): every module of dist/ imported, each by its file.
  const loaded = await run(process.execPath, ['--input-type=module', '-e', LOAD_ALL, libDir, JSON.stringify(deps)], { cwd: libDir });
  t.equal(loaded.code, 0, `every dependency of package.json and every module of dist/ load from the copy${loaded.code === 0 ? '' : `:\n${loaded.stderr.slice(-3000)}`}`);
  t.match(loaded.stdout, new RegExp(`^loaded ${deps.length} packages, \\d+ modules\\n$`), loaded.stdout.trim());
});
