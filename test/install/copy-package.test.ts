import { existsSync, lstatSync, mkdirSync, readdirSync, readlinkSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import t from 'tap';
import { ConfigError } from '../../src/errors.js';
import { copyPackage, planPackageCopy } from '../../src/install/copy-package.js';
import { install } from '../../src/install/install.js';
import { tempDir } from '../support/temp-dir.js';

/**
 * `install`'s copy of a package tree, on a small checkout made here: real files, real links,
 * a real package-lock.json. test/install/install-checkout.test.ts does the same from this
 * repository's own checkout and runs what it copied.
 */

const write = (path: string, text = ''): void => {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
};

const link = (target: string, path: string): void => {
  mkdirSync(dirname(path), { recursive: true });
  symlinkSync(target, path);
};

/** Every entry under `root`: `dir/`, `file`, `link -> target`; sorted. */
function entries(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string, rel: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isSymbolicLink()) out.push(`${r} -> ${readlinkSync(join(dir, e.name))}`);
      else if (e.isDirectory()) {
        out.push(`${r}/`);
        walk(join(dir, e.name), r);
      } else out.push(r);
    }
  };
  walk(root, '');
  return out.sort();
}

const LOCK = {
  name: 'pkg',
  version: '1.0.0',
  lockfileVersion: 3,
  requires: true,
  packages: {
    '': { name: 'pkg', dependencies: { prod: '^1', '@scope/prod-thing': '^1' }, devDependencies: { tool: '^1', '@scope/dev-thing': '^1' } },
    'node_modules/prod': { version: '1.0.0', bin: { prod: 'index.js' } },
    'node_modules/prod/node_modules/dev-nested': { version: '1.0.0', dev: true },
    'node_modules/@scope/prod-thing': { version: '1.0.0' },
    'node_modules/@scope/dev-thing': { version: '1.0.0', dev: true },
    'node_modules/tool': { version: '1.0.0', dev: true, bin: { tool: 'bin/tool.js' } },
    'node_modules/tool/node_modules/under-dev': { version: '1.0.0', dev: true },
    'node_modules/both': { version: '1.0.0', devOptional: true },
    'node_modules/opt': { version: '1.0.0', optional: true },
  },
};

/** A checkout: package.json, README, dist (with dist/dev), docs, and node_modules as npm lays it out; `lock` null: no lockfile. */
function makeCheckout(dir: string, lock: string | null = JSON.stringify(LOCK)): string {
  write(join(dir, 'package.json'), '{"name":"pkg"}\n');
  write(join(dir, 'README.md'), '# pkg\n');
  write(join(dir, 'dist', 'cli.js'), '');
  write(join(dir, 'dist', 'dev', 'dev-command.js'), '');
  write(join(dir, 'docs', 'install.md'), '');
  if (lock !== null) write(join(dir, 'package-lock.json'), lock);
  const nm = join(dir, 'node_modules');
  for (const p of ['prod/index.js', 'prod/node_modules/dev-nested/cli.js', '@scope/prod-thing/index.js', '@scope/dev-thing/index.js', 'tool/bin/tool.js', 'tool/node_modules/under-dev/index.js', 'both/index.js', 'opt/index.js', 'extraneous/index.js']) {
    write(join(nm, p));
  }
  link('../prod/index.js', join(nm, '.bin', 'prod'));
  link('../tool/bin/tool.js', join(nm, '.bin', 'tool'));
  link('/usr/bin/env', join(nm, '.bin', 'absolute'));
  link('../dev-nested/cli.js', join(nm, 'prod', 'node_modules', '.bin', 'dev-nested'));
  // Not a .bin entry: a link elsewhere is copied as it is, even into a dev package.
  link('../tool/bin/tool.js', join(nm, 'prod', 'tool-link'));
  write(join(nm, '.package-lock.json'), '{}');
  return dir;
}

const SHIPPED_OUTSIDE_NODE_MODULES = ['README.md', 'dist/', 'dist/cli.js', 'docs/', 'docs/install.md', 'package.json'];

t.test('from a checkout with a lockfile: the production packages, not the dev-only ones nor .bin links into them', async (t) => {
  const d = tempDir('ac-copypkg-', t);
  const from = makeCheckout(join(d, 'checkout'));
  const dest = join(d, 'lib');
  mkdirSync(dest);
  await copyPackage(await planPackageCopy(from), dest);
  t.same(
    entries(dest),
    [
      ...SHIPPED_OUTSIDE_NODE_MODULES,
      'node_modules/',
      'node_modules/.bin/',
      'node_modules/.bin/absolute -> /usr/bin/env',
      'node_modules/.bin/prod -> ../prod/index.js',
      'node_modules/.package-lock.json',
      'node_modules/@scope/',
      'node_modules/@scope/prod-thing/',
      'node_modules/@scope/prod-thing/index.js',
      'node_modules/both/',
      'node_modules/both/index.js',
      'node_modules/extraneous/',
      'node_modules/extraneous/index.js',
      'node_modules/opt/',
      'node_modules/opt/index.js',
      'node_modules/prod/',
      'node_modules/prod/index.js',
      'node_modules/prod/node_modules/',
      'node_modules/prod/node_modules/.bin/',
      'node_modules/prod/tool-link -> ../tool/bin/tool.js',
    ].sort(),
    'dev, nested dev and their .bin links left out; devOptional, optional and packages the lockfile does not know copied; links as written; no dist/dev',
  );
});

t.test('without a lockfile (an npm tarball, an installed package): node_modules whole, less dist/dev as always', async (t) => {
  const d = tempDir('ac-copypkg-', t);
  const from = makeCheckout(join(d, 'checkout'), null);
  const dest = join(d, 'lib');
  mkdirSync(dest);
  const plan = await planPackageCopy(from);
  t.same([...plan.devOnly], [], 'nothing is dev-only');
  await copyPackage(plan, dest);
  t.same(entries(join(dest, 'node_modules')), entries(join(from, 'node_modules')), 'node_modules copied as it is, links as written');
  t.notOk(existsSync(join(dest, 'dist', 'dev')), 'dist/dev is not shipped');
});

t.test('a node_modules that is a link is copied as the tree it names, not as a link into the checkout', async (t) => {
  const d = tempDir('ac-copypkg-', t);
  const from = makeCheckout(join(d, 'checkout'));
  renameSync(join(from, 'node_modules'), join(d, 'shared-node_modules'));
  symlinkSync(join(d, 'shared-node_modules'), join(from, 'node_modules'));
  const dest = join(d, 'lib');
  mkdirSync(dest);
  await copyPackage(await planPackageCopy(from), dest);
  t.ok(lstatSync(join(dest, 'node_modules')).isDirectory(), 'a folder');
  t.ok(existsSync(join(dest, 'node_modules', 'prod', 'index.js')), 'with the production packages');
  t.notOk(existsSync(join(dest, 'node_modules', 'tool')), 'and without the dev-only ones');
});

t.test('a node_modules named by the caller (the .deb build) is copied whole; the lockfile is not read', async (t) => {
  const d = tempDir('ac-copypkg-', t);
  const from = makeCheckout(join(d, 'checkout'), '{ not json');
  const production = join(d, 'production', 'node_modules');
  write(join(production, 'prod', 'index.js'));
  write(join(production, 'tool', 'index.js'));
  const dest = join(d, 'lib');
  mkdirSync(dest);
  await copyPackage(await planPackageCopy(from, production), dest);
  t.same(entries(join(dest, 'node_modules')), ['prod/', 'prod/index.js', 'tool/', 'tool/index.js'], "the caller's tree, as it is");
});

t.test('an invalid lockfile stops install before anything is written: a ConfigError naming the file', async (t) => {
  const d = tempDir('ac-copypkg-', t);
  for (const [what, text] of [
    ['not JSON', '{"lockfileVersion": 3, "packages": {'],
    ['version 1', JSON.stringify({ lockfileVersion: 1, dependencies: {} })],
    ['dev not a boolean', JSON.stringify({ ...LOCK, packages: { 'node_modules/tool': { dev: 'yes' } } })],
  ] as const) {
    const from = makeCheckout(join(d, what.replace(/ /g, '-')), text);
    const file = join(from, 'package-lock.json');
    const err = await planPackageCopy(from).catch((e: unknown) => e);
    t.ok(err instanceof ConfigError, `${what}: a ConfigError (exit 2)`);
    t.match((err as Error).message, `${file} is invalid (`, `${what}: names the file: ${(err as Error).message}`);
    t.match((err as Error).message, /restore it \(git checkout package-lock\.json\) and run npm ci/, `${what}: and says what to do`);

    // The installed package of an earlier install stays as it was: nothing removed, nothing half-copied.
    const root = join(d, `root-${what.replace(/ /g, '-')}`);
    const libDir = join(root, 'usr/local/lib/agent-connectors');
    write(join(libDir, 'dist', 'cli.js'), 'the installed one');
    const before = entries(root);
    const installErr = await install({ prefix: '/usr/local', root, node: '/usr/bin/node', dryRun: false, activate: false, from }).catch((e: unknown) => e);
    t.ok(installErr instanceof ConfigError, `${what}: install fails with it`);
    t.same(entries(root), before, `${what}: and writes or removes nothing`);
    const dry = await install({ prefix: '/usr/local', root, node: '/usr/bin/node', dryRun: true, activate: false, from }).catch((e: unknown) => e);
    t.ok(dry instanceof ConfigError, `${what}: --dry-run reports it too`);
  }
});
