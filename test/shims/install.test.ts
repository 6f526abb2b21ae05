import { chmodSync, cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import type { Catalog } from '../../src/data/catalog.js';
import { ConfigError } from '../../src/errors.js';
import { PACKAGE_PARTS } from '../../src/data/package-parts.js';
import { installShims, shimDirRefusal } from '../../src/shims/install.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

/** Where base-url shims would find the CA bundle: these catalogs have no TLS provider. */
const BUNDLE = '/var/lib/agent-connectors-ca/ca-bundle.pem';

const PROTOTYPE = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../shims/shim.sh.in');

const catalog = (commands: string[]): Catalog => ({
  acme: {
    upstream: 'https://api.acme.example',
    tokenFile: '/var/lib/agent-connectors/cli-proxy/acme.token',
    inject: { type: 'header', name: 'authorization', value: 'Bearer {token}' },
    commands: commands.map((name) => ({ name, env: {} })),
  },
});

t.test('the sweep removes only shims it rendered: never the prototype, a copy of it, or a foreign file', async (t) => {
  const dir = tempDir('ac-shims-', t);
  await installShims(catalog(['acme', 'acme-admin']), dir, 'http://127.0.0.1:14324', BUNDLE);
  // What bricked installs: the prototype in the shim directory carries the marker too.
  cpSync(PROTOTYPE, join(dir, 'shim.sh.in'));
  writeFileSync(join(dir, 'notes'), '# agent-connectors-shim: someone else\n');
  const r = await installShims(catalog(['acme']), dir, 'http://127.0.0.1:14324', BUNDLE);
  t.same(r.removed, ['acme-admin'], 'the command the catalog dropped');
  t.same(readdirSync(dir).sort(), ['acme', 'notes', 'shim.sh.in']);
  t.equal(readFileSync(join(dir, 'shim.sh.in'), 'utf8'), readFileSync(PROTOTYPE, 'utf8'), 'the prototype copy is intact');
});

t.test('a shim directory inside the installed package is refused with the reason and the default', async (t) => {
  const inside = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../shims');
  const err = await installShims(catalog(['acme']), inside, 'http://127.0.0.1:14324', BUNDLE).catch((e: unknown) => e);
  t.ok(err instanceof ConfigError, 'a ConfigError (exit 2)');
  t.match((err as Error).message, /inside the installed package.*an upgrade replaces.*\/var\/lib\/agent-connectors-shims/);
  t.ok(existsSync(join(inside, 'shim.sh.in')), 'the prototype is untouched');
  t.notOk(existsSync(join(inside, 'acme')), 'nothing was written there');
  const nested = join(inside, 'sub');
  const err2 = await installShims(catalog(['acme']), nested, 'http://127.0.0.1:14324', BUNDLE).catch((e: unknown) => e);
  t.ok(err2 instanceof ConfigError, 'a directory below it too');
});

/** A package root as install or the .deb lays it out; `checkout` adds the sources. */
function packageRoot(t: TapTest, checkout: boolean): string {
  const root = tempDir('ac-pkg-', t);
  for (const part of ['dist', 'shims', 'units', 'node_modules', ...(checkout ? ['src'] : [])]) mkdirSync(join(root, part));
  return root;
}

t.test('an installed package (no sources): nothing under it may hold shims, everything outside may', async (t) => {
  const root = packageRoot(t, false);
  for (const dir of [root, join(root, 'shims'), join(root, 'dist', 'x'), join(root, '.state', 'shims'), join(root, 'mine')]) {
    t.match(shimDirRefusal(dir, root), /inside the installed package \(.*\), which an upgrade replaces.*\/var\/lib\/agent-connectors-shims/, `refused: ${dir}`);
  }
  t.equal(shimDirRefusal(`${root}-shims`, root), undefined, 'a sibling whose name starts like it');
  t.equal(shimDirRefusal(join(root, '..', 'elsewhere'), root), undefined, 'outside');
});

t.test('a checkout: what an upgrade replaces is refused, the rest (dev\'s ./.state/shims) is not', async (t) => {
  const root = packageRoot(t, true);
  for (const part of PACKAGE_PARTS) {
    t.match(shimDirRefusal(join(root, part, 'sub'), root), new RegExp(`inside the installed package's ${part} .*which an upgrade replaces`), `refused: ${part}/sub`);
  }
  t.match(shimDirRefusal(join(root, 'shims'), root), /package's shims/, 'the prototype directory itself');
  t.match(shimDirRefusal(join(root, 'x', '..'), root), /inside the installed package \(/, 'the root itself, however written');
  t.equal(shimDirRefusal(join(root, '.state', 'shims'), root), undefined, "dev's default");
  t.equal(shimDirRefusal(join(root, '..shims'), root), undefined, 'a directory whose name starts with two dots is inside, not above');
  t.equal(shimDirRefusal(join(root, 'shims-mine'), root), undefined, 'a name that only starts like a part');
});

t.test("installShims writes into a checkout's own state directory (what dev does by default)", async (t) => {
  // The tests' package root is build/, a checkout: it holds the compiled sources.
  const root = resolve(fileURLToPath(new URL('.', import.meta.url)), '../..');
  const dir = join(root, `.state-${process.pid}`, 'shims');
  t.teardown(() => rmSync(dirname(dir), { recursive: true, force: true }));
  const r = await installShims(catalog(['acme']), dir, 'http://127.0.0.1:14324', BUNDLE);
  t.same(r.written, ['acme']);
  t.equal(statSync(join(dir, 'acme')).mode & 0o777, 0o755);
});

t.test('the sweep removes a dot-named shim an older release rendered, and every other dot entry but directories', async (t) => {
  const dir = tempDir('ac-shims-', t);
  await installShims(catalog(['acme']), dir, 'http://127.0.0.1:14324', BUNDLE);
  // What an older release wrote for a catalog command named `.profile`.
  const old = readFileSync(join(dir, 'acme'), 'utf8').replace('agent-connectors-shim: acme (provider', 'agent-connectors-shim: .profile (provider');
  writeFileSync(join(dir, '.profile'), old, { mode: 0o755 });
  writeFileSync(join(dir, '.bashrc'), 'id\n', { mode: 0o644 });
  symlinkSync('/etc/hostname', join(dir, '.link'));
  mkdirSync(join(dir, '.keepdir'));
  // A live writer's temp file (ours: this pid) is not swept from under it.
  const temp = `.acme.${process.pid}.0123456789ab.tmp`;
  writeFileSync(join(dir, temp), '');
  writeFileSync(join(dir, 'operator-tool'), '#!/bin/sh\necho mine\n', { mode: 0o755 });
  const r = await installShims(catalog(['acme']), dir, 'http://127.0.0.1:14324', BUNDLE);
  t.same(r.removed.sort(), ['.bashrc', '.link', '.profile']);
  t.same(readdirSync(dir).sort(), ['.keepdir', temp, 'acme', 'operator-tool'].sort(), 'a directory, a live temp file and a foreign non-dot file stay');
});

t.test('a shim already in place as rendered is left as it is; a changed, chmod-ed or replaced one is written again', async (t) => {
  const dir = tempDir('ac-shims-', t);
  const first = await installShims(catalog(['acme', 'acme-admin', 'acme-ro']), dir, 'http://127.0.0.1:14324', BUNDLE);
  t.same(first.changed, ['acme', 'acme-admin', 'acme-ro'], 'all new');
  const ino = (name: string): number => statSync(join(dir, name)).ino;
  const before = { acme: ino('acme'), admin: ino('acme-admin'), ro: ino('acme-ro') };
  chmodSync(join(dir, 'acme-admin'), 0o777);
  writeFileSync(join(dir, 'acme-ro'), `${readFileSync(join(dir, 'acme-ro'), 'utf8')}# edited\n`);
  const again = await installShims(catalog(['acme', 'acme-admin', 'acme-ro']), dir, 'http://127.0.0.1:14324', BUNDLE);
  t.same(again.written, ['acme', 'acme-admin', 'acme-ro'], 'every shim is in place');
  t.same(again.changed, ['acme-admin', 'acme-ro'], 'only the two that differ');
  t.equal(ino('acme'), before.acme, 'the unchanged shim is the same file');
  t.not(ino('acme-admin'), before.admin);
  t.equal(statSync(join(dir, 'acme-admin')).mode & 0o7777, 0o755, 'its mode back to 0755');
  t.notMatch(readFileSync(join(dir, 'acme-ro'), 'utf8'), /# edited/, 'the edit undone');
  const withUrl = (port: number): Promise<{ changed: string[] }> => {
    const c = catalog(['acme']);
    c.acme!.commands[0]!.env = { ACME_URL: '{baseUrl}' };
    return installShims(c, dir, `http://127.0.0.1:${port}`, BUNDLE);
  };
  t.same((await withUrl(14324)).changed, ['acme'], 'a new variable: rewritten');
  t.same((await withUrl(14324)).changed, [], 'the same again: left');
  t.same((await withUrl(9)).changed, ['acme'], 'another proxy URL: rewritten');
  t.match(readFileSync(join(dir, 'acme'), 'utf8'), /127\.0\.0\.1:9\/p\/acme/);
});
