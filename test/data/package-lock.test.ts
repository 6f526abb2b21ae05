import t from 'tap';
import { devOnlyFolders, parsePackageLock } from '../../src/data/package-lock.js';

const lock = (packages: Record<string, unknown>, lockfileVersion: unknown = 3): string => JSON.stringify({ name: 'x', version: '1.0.0', lockfileVersion, requires: true, packages });

t.test('devOnlyFolders: the dev entries, nested ones too; devOptional, optional and production ones are not', async (t) => {
  const r = parsePackageLock(
    lock({
      '': { name: 'x', dependencies: { prod: '^1' }, devDependencies: { tool: '^1' } },
      'node_modules/prod': { version: '1.0.0', dependencies: { shared: '^1' } },
      'node_modules/tool': { version: '1.0.0', dev: true, bin: { tool: 'cli.js' } },
      'node_modules/@scope/dev-thing': { version: '1.0.0', dev: true },
      'node_modules/prod/node_modules/dev-nested': { version: '1.0.0', dev: true },
      'node_modules/tool/node_modules/under-dev': { version: '1.0.0', dev: true },
      'node_modules/both': { version: '1.0.0', devOptional: true },
      'node_modules/fsevents': { version: '2.3.3', optional: true, os: ['darwin'] },
      'node_modules/dev-optional-of-dev': { version: '1.0.0', dev: true, optional: true },
      'node_modules/peer-dev': { version: '1.0.0', dev: true, peer: true },
      'node_modules/explicitly-not': { version: '1.0.0', dev: false },
      'packages/workspace-dev': { version: '1.0.0', dev: true },
      'node_modules/some-new-field': { version: '1.0.0', futureFlag: { anything: 1 } },
    }),
  );
  t.ok(r.ok, r.ok ? 'parses' : r.error);
  if (!r.ok) return;
  t.same(
    [...devOnlyFolders(r.value)].sort(),
    [
      'node_modules/@scope/dev-thing',
      'node_modules/dev-optional-of-dev',
      'node_modules/peer-dev',
      'node_modules/prod/node_modules/dev-nested',
      'node_modules/tool',
      'node_modules/tool/node_modules/under-dev',
    ],
    'dev: true under node_modules, and nothing else',
  );
});

t.test('lockfileVersion 2 is read like 3', async (t) => {
  const r = parsePackageLock(lock({ '': {}, 'node_modules/tool': { dev: true } }, 2));
  t.same(r.ok && [...devOnlyFolders(r.value)], ['node_modules/tool']);
});

t.test('a file that is not a lockfile this reads is an error naming what is wrong, never quoting the text', async (t) => {
  for (const [what, text, error] of [
    ['not JSON', '{"lockfileVersion": 3, "packages": {"VALUE-X"', /^invalid JSON$/],
    ['version 1 (npm 6: no packages map)', JSON.stringify({ lockfileVersion: 1, dependencies: { tool: { version: 'VALUE-X', dev: true } } }), /lockfileVersion: invalid value; packages: expected record/],
    ['no version', JSON.stringify({ packages: {} }), /lockfileVersion/],
    ['dev not a boolean', lock({ 'node_modules/tool': { dev: 'VALUE-X' } }), /packages\.node_modules\/tool\.dev: expected boolean/],
    ['an entry not an object', lock({ 'node_modules/tool': 'VALUE-X' }), /packages\.node_modules\/tool: expected object/],
    ['an array', '[]', /\(root\): expected object/],
  ] as const) {
    const r = parsePackageLock(text);
    t.equal(r.ok, false, `${what}: rejected`);
    if (!r.ok) {
      t.match(r.error, error, `${what}: ${r.error}`);
      t.notMatch(r.error, /VALUE-X/, `${what}: no value echoed`);
    }
  }
});
