import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import type { Catalog } from '../../src/data/catalog.js';
import { PLACEHOLDER, renderShims, SHIM_MARKER, shQuote } from '../../src/shims/render.js';
import { tempDir } from '../support/temp-dir.js';

/** Values a catalog may hold that sh or String.replace would otherwise interpret. */
const TRICKY = `it's $(id) \`id\` \${HOME} \\ "q" * ; $$ $& $' x`;

function catalog(env: Record<string, string>, shimNames = ['fx']): Catalog {
  return {
    demo: {
      upstream: 'https://api.example.com/v1',
      tokenFile: '/var/lib/agent-connectors/cli-proxy/demo.token',
      inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      commands: shimNames.map((name) => ({ name, env })),
    },
  };
}

t.test('shQuote: single quotes, an embedded quote closed and escaped', async (t) => {
  t.equal(shQuote('plain'), `'plain'`);
  t.equal(shQuote(`it's`), `'it'\\''s'`);
  t.equal(shQuote(''), `''`);
});

t.test('one shim per command, marked as ours on line 2, naming command and provider', async (t) => {
  const shims = renderShims(catalog({}, ['fx', 'fy']), '/opt/shims', 'http://127.0.0.1:4000/');
  t.same(
    shims.map((s) => [s.name, s.provider]),
    [
      ['fx', 'demo'],
      ['fy', 'demo'],
    ],
  );
  const lines = shims[0]?.script.split('\n') ?? [];
  t.equal(lines[0], '#!/bin/sh');
  t.ok(lines[1]?.startsWith(`${SHIM_MARKER} fx (provider demo)`), 'the install marker is on line 2');
  t.notMatch(shims[0]?.script ?? '', /@[A-Z_]+@/, 'no template placeholder left');
  t.match(shims[0]?.script ?? '', "shim_dir='/opt/shims'");
});

t.test('{baseUrl} and {placeholder} are filled; nothing of the token file or injection is written', async (t) => {
  const [shim] = renderShims(catalog({ BASE: '{baseUrl}/x', TOKEN: '{placeholder}' }), '/opt/shims', 'http://127.0.0.1:4000///');
  const script = shim?.script ?? '';
  t.match(script, "BASE='http://127.0.0.1:4000/p/demo/x'\nexport BASE");
  t.match(script, `TOKEN='${PLACEHOLDER}'\nexport TOKEN`);
  t.notMatch(script, 'demo.token');
  t.notMatch(script, 'Bearer');
});

t.test('a rendered shim runs the real command with the values verbatim (sh runs it)', async (t) => {
  const base = tempDir('ac-render-', t);
  const shimDir = join(base, 'shims');
  const binDir = join(base, 'bin');
  mkdirSync(shimDir);
  mkdirSync(binDir);
  writeFileSync(join(binDir, 'fx'), '#!/bin/sh\nprintf "%s|%s|%s" "$TRICKY" "$BASE" "$*"\n', { mode: 0o755 });
  chmodSync(join(binDir, 'fx'), 0o755);
  const [shim] = renderShims(catalog({ TRICKY, BASE: '{baseUrl}' }), shimDir, 'http://127.0.0.1:4000');
  writeFileSync(join(shimDir, 'fx'), shim?.script ?? '', { mode: 0o755 });
  const out = execFileSync('/bin/sh', [join(shimDir, 'fx'), 'a b', 'c'], {
    // The shim's own directory first: it must skip itself and find the real fx.
    env: { PATH: `${shimDir}:${binDir}:/usr/bin:/bin`, HOME: base },
    encoding: 'utf8',
  });
  t.equal(out, `${TRICKY}|http://127.0.0.1:4000/p/demo|a b c`);
});

t.test('a tls provider\'s shim: HTTPS_PROXY and every CA bundle variable, its own placeholder', async (t) => {
  const tls: Catalog = {
    gh: {
      mode: 'tls',
      hosts: ['api.github.com'],
      tokenFile: '/var/lib/agent-connectors/cli-proxy/gh.token',
      inject: { type: 'header', name: 'Authorization', value: 'token {token}' },
      placeholder: 'ghp_agentconnectors000000000000000000000',
      // A catalog cannot point the bundle elsewhere: the shim's own values come last.
      commands: [{ name: 'gh', env: { GH_TOKEN: '{placeholder}', SSL_CERT_FILE: '/tmp/evil.pem' } }],
    },
  };
  const [shim] = renderShims(tls, '/opt/shims', 'http://127.0.0.1:14324/', '/opt/shims/.ca-bundle.pem');
  const script = shim?.script ?? '';
  t.match(script, `GH_TOKEN='ghp_agentconnectors000000000000000000000'\nexport GH_TOKEN`);
  for (const v of ['HTTPS_PROXY', 'https_proxy']) t.match(script, `${v}='http://127.0.0.1:14324'\nexport ${v}`);
  for (const v of ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO', 'AWS_CA_BUNDLE']) {
    t.match(script, `${v}='/opt/shims/.ca-bundle.pem'\nexport ${v}`, v);
  }
  t.notMatch(script, 'evil.pem', 'the catalog\'s SSL_CERT_FILE is replaced');
  const [plain] = renderShims(catalog({ T: '{placeholder}' }), '/opt/shims', 'http://127.0.0.1:14324');
  t.notMatch(plain?.script ?? '', 'HTTPS_PROXY', 'a base-url provider\'s shim sets no proxy');
  t.match(plain?.script ?? '', `T='${PLACEHOLDER}'`, 'and keeps the fixed placeholder');
});
