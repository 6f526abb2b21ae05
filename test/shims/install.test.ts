import { cpSync, existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import type { Catalog } from '../../src/data/catalog.js';
import { ConfigError } from '../../src/errors.js';
import { installShims } from '../../src/shims/install.js';
import { tempDir } from '../support/temp-dir.js';

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
  await installShims(catalog(['acme', 'acme-admin']), dir, 'http://127.0.0.1:14324');
  // What bricked installs: the prototype in the shim directory carries the marker too.
  cpSync(PROTOTYPE, join(dir, 'shim.sh.in'));
  writeFileSync(join(dir, 'notes'), '# agent-connectors-shim: someone else\n');
  const r = await installShims(catalog(['acme']), dir, 'http://127.0.0.1:14324');
  t.same(r.removed, ['acme-admin'], 'the command the catalog dropped');
  t.same(readdirSync(dir).sort(), ['acme', 'notes', 'shim.sh.in']);
  t.equal(readFileSync(join(dir, 'shim.sh.in'), 'utf8'), readFileSync(PROTOTYPE, 'utf8'), 'the prototype copy is intact');
});

t.test('a shim directory inside the installed package is refused with the reason and the default', async (t) => {
  const inside = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../shims');
  const err = await installShims(catalog(['acme']), inside, 'http://127.0.0.1:14324').catch((e: unknown) => e);
  t.ok(err instanceof ConfigError, 'a ConfigError (exit 2)');
  t.match((err as Error).message, /inside the installed package.*an upgrade replaces.*\/var\/lib\/agent-connectors-shims/);
  t.ok(existsSync(join(inside, 'shim.sh.in')), 'the prototype is untouched');
  t.notOk(existsSync(join(inside, 'acme')), 'nothing was written there');
  const nested = join(inside, 'sub');
  const err2 = await installShims(catalog(['acme']), nested, 'http://127.0.0.1:14324').catch((e: unknown) => e);
  t.ok(err2 instanceof ConfigError, 'a directory below it too');
});
