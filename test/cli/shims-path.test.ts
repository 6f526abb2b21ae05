/**
 * `shims path` (SPEC §10): besides the PATH line, where TLS mode's trust lives (the CLI
 * CA's certificate and key, the shims' CA bundle) and the provider ports of the catalog
 * in force — every extra line a shell comment, so the output stays runnable.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { startCli } from '../support/cli-proc.js';
import { tempDir } from '../support/temp-dir.js';

async function shimsPath(args: string[]): Promise<{ code: number | null; lines: string[] }> {
  const p = startCli(['shims', 'path', '--agent', 'claude', ...args]);
  const { code } = await p.exited;
  return { code, lines: p.lines };
}

t.test('the CA certificate, its key, the bundle; the catalog\'s provider ports in port order', async (t) => {
  const state = tempDir('ac-shims-path-', t);
  mkdirSync(join(state, 'cli-proxy'), { mode: 0o700 });
  const inject = { type: 'header', name: 'Authorization', value: 'Bearer {token}' };
  const tokenFile = join(state, 'cli-proxy', 'x.token');
  writeFileSync(
    join(state, 'cli-proxy', 'providers.json'),
    JSON.stringify({
      zeta: { upstream: 'https://api.zeta.example', tokenFile, inject, port: 18301 },
      alpha: { upstream: 'https://api.alpha.example', tokenFile, inject, port: 18342 },
      plain: { upstream: 'https://api.plain.example', tokenFile, inject },
      gh: { mode: 'tls', hosts: ['api.github.com'], tokenFile, inject },
    }),
  );
  const r = await shimsPath(['--state-dir', state]);
  t.equal(r.code, 0);
  t.ok(r.lines.slice(1).every((l) => l.startsWith('# ')), 'every further line is a comment');
  t.ok(r.lines.includes('# provider ports (18300-18399), on 127.0.0.1: zeta 18301, alpha 18342'), `the ports (got ${JSON.stringify(r.lines)})`);
  t.equal(
    r.lines.at(-1),
    `# TLS mode: the CLI CA's certificate ${state}/cli-ca/ca-cert.pem (its key ${state}/cli-ca/ca.pem: the cli-proxy's user alone); the shims' CA bundle ${state}/ca-bundle/ca-bundle.pem`,
  );
  const other = await shimsPath(['--state-dir', state, '--ca-bundle', '/srv/ca/bundle.pem']);
  t.match(other.lines.at(-1), / the shims' CA bundle \/srv\/ca\/bundle\.pem$/, '--ca-bundle is what it prints');
});

t.test('no catalog: no ports line; an invalid one: said, and the rest still printed', async (t) => {
  const state = tempDir('ac-shims-path-', t);
  const none = await shimsPath(['--state-dir', state]);
  t.equal(none.code, 0);
  t.notOk(none.lines.some((l) => l.includes('provider ports')), 'nothing to say');
  const bad = join(state, 'bad.json');
  writeFileSync(bad, '{"x": 1}');
  const invalid = await shimsPath(['--state-dir', state, '--providers', bad]);
  t.equal(invalid.code, 0, 'the PATH line is what the command is for');
  t.ok(invalid.lines.includes(`# provider ports (18300-18399): ${bad} is invalid`), `said (got ${JSON.stringify(invalid.lines)})`);
  t.match(invalid.lines.at(-1), /^# TLS mode: /);
});
