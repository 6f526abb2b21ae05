import { chmodSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { openCliCa, systemCaText } from '../../src/cli-proxy/cli-ca.js';
import { ConfigError } from '../../src/errors.js';
import { memoryLogger } from '../support/memory-log.js';
import { tempDir } from '../support/temp-dir.js';

t.test('first start: the CA is made 0600 in a 0700 directory, the bundle 0644 with the system CAs and ours', async (t) => {
  const base = tempDir('ac-cli-ca-', t);
  const paths = { dir: join(base, 'cli-ca'), bundle: join(base, 'ca', 'ca-bundle.pem') };
  const { log: logger } = memoryLogger();
  const ca = await openCliCa(paths, logger);
  t.equal(statSync(paths.dir).mode & 0o777, 0o700);
  t.equal(statSync(join(paths.dir, 'ca.pem')).mode & 0o777, 0o600);
  t.equal(statSync(join(paths.dir, 'ca-cert.pem')).mode & 0o777, 0o644);
  t.equal(statSync(paths.bundle).mode & 0o777, 0o644);
  const bundle = readFileSync(paths.bundle, 'utf8');
  t.ok(bundle.startsWith(await systemCaText()), 'the system CAs first');
  t.ok(bundle.endsWith(ca.cert), 'ours last');
  t.notMatch(bundle, /PRIVATE KEY/, 'no key in the bundle');
  t.notMatch(readFileSync(join(paths.dir, 'ca-cert.pem'), 'utf8'), /PRIVATE KEY/);

  const again = await openCliCa(paths, logger);
  t.equal(again.cert, ca.cert, 'the next start keeps the CA');
});

t.test('two starts at once end up with one CA', async (t) => {
  const base = tempDir('ac-cli-ca-', t);
  const paths = { dir: join(base, 'cli-ca'), bundle: join(base, 'bundle.pem') };
  const { log: logger } = memoryLogger();
  const [a, b] = await Promise.all([openCliCa(paths, logger), openCliCa(paths, logger)]);
  t.equal(a.cert, b.cert);
  t.equal(readFileSync(join(paths.dir, 'ca-cert.pem'), 'utf8'), a.cert);
});

t.test('a CA file others could read is refused: its key may be known', async (t) => {
  const base = tempDir('ac-cli-ca-', t);
  const paths = { dir: join(base, 'cli-ca'), bundle: join(base, 'bundle.pem') };
  const { log: logger } = memoryLogger();
  await openCliCa(paths, logger);
  chmodSync(join(paths.dir, 'ca.pem'), 0o640);
  await t.rejects(openCliCa(paths, logger), ConfigError);
  await t.rejects(openCliCa(paths, logger), /not a 0600 file of this user/);
  writeFileSync(join(paths.dir, 'ca.pem'), 'garbage', { mode: 0o600 });
  chmodSync(join(paths.dir, 'ca.pem'), 0o600);
  await t.rejects(openCliCa(paths, logger), /cannot be used/);
});

t.test('a CA near its end is replaced at start', async (t) => {
  const base = tempDir('ac-cli-ca-', t);
  const paths = { dir: join(base, 'cli-ca'), bundle: join(base, 'bundle.pem') };
  const { log: logger } = memoryLogger();
  const old = await openCliCa(paths, logger, new Date(Date.now() - 3640 * 86_400_000));
  const fresh = await openCliCa(paths, logger);
  t.not(fresh.cert, old.cert);
  t.ok(readFileSync(paths.bundle, 'utf8').endsWith(fresh.cert), 'the bundle names the new one');
});
