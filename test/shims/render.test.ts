import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import type { Catalog } from '../../src/data/catalog.js';
import { PLACEHOLDER, renderShims, SHIM_MARKER, shQuote } from '../../src/shims/render.js';
import { tempDir } from '../support/temp-dir.js';

/** Values a catalog may hold that sh or String.replace would otherwise interpret. */
/** Where base-url shims would find the CA bundle: unused by them, named by every caller. */
const B = '/opt/ca/ca-bundle.pem';
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
  const shims = renderShims(catalog({}, ['fx', 'fy']), '/opt/shims', 'http://127.0.0.1:4000/', B);
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
  t.match(shims[0]?.script ?? '', "__ac_shim_dir='/opt/shims'");
});

t.test('{baseUrl} and {placeholder} are filled; nothing of the token file or injection is written', async (t) => {
  const [shim] = renderShims(catalog({ BASE: '{baseUrl}/x', TOKEN: '{placeholder}' }), '/opt/shims', 'http://127.0.0.1:4000///', B);
  const script = shim?.script ?? '';
  t.match(script, "\n  BASE='http://127.0.0.1:4000/p/demo/x' \\\n");
  t.match(script, `\n  TOKEN='${PLACEHOLDER}' \\\n`);
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
  const [shim] = renderShims(catalog({ TRICKY, BASE: '{baseUrl}' }), shimDir, 'http://127.0.0.1:4000', B);
  writeFileSync(join(shimDir, 'fx'), shim?.script ?? '', { mode: 0o755 });
  const out = execFileSync('/bin/sh', [join(shimDir, 'fx'), 'a b', 'c'], {
    // The shim's own directory first: it must skip itself and find the real fx.
    env: { PATH: `${shimDir}:${binDir}:/usr/bin:/bin`, HOME: base },
    encoding: 'utf8',
  });
  t.equal(out, `${TRICKY}|http://127.0.0.1:4000/p/demo|a b c`);
});

t.test('the catalog environment goes to env(1) as quoted words on the exec line; the shell exports nothing', async (t) => {
  const [shim] = renderShims(catalog({ BASE: '{baseUrl}', TOKEN: '{placeholder}' }), '/opt/shims', 'http://127.0.0.1:4000', B);
  const script = shim?.script ?? '';
  t.notMatch(script, /^\s*export\b/m, 'no export');
  t.match(script, /\nexec \/usr\/bin\/env -- \\\n  BASE='[^']*' \\\n  TOKEN='[^']*' \\\n  "\$__ac_real" "\$@"\n$/, 'one exec, env words, then the real command and the arguments');
  const [bare] = renderShims(catalog({}), '/opt/shims', 'http://127.0.0.1:4000', B);
  t.match(bare?.script ?? '', /\nexec \/usr\/bin\/env -- "\$__ac_real" "\$@"\n$/, 'no environment: env with nothing to add');
  // Every shell variable of the shim carries the prefix no catalog name may have.
  const beforeExec = (shim?.script ?? '').split('\nexec ')[0] ?? '';
  const assigned = [...beforeExec.matchAll(/^\s*(?:for )?([A-Za-z_][A-Za-z0-9_]*)=|\bfor ([A-Za-z_][A-Za-z0-9_]*) in/gm)].map((m) => m[1] ?? m[2]);
  t.ok(assigned.length > 5, 'the shim assigns its variables');
  t.same(assigned.filter((v) => v !== undefined && v !== 'IFS' && !v.startsWith('__ac_')), [], 'all of them __ac_* (IFS is restored before exec)');
});

t.test('the renderer refuses what the catalog rules refuse, whoever calls it', async (t) => {
  t.throws(() => renderShims(catalog({ LD_PRELOAD: '/tmp/x.so' }), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
  t.throws(() => renderShims(catalog({}, ['.profile']), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
  t.throws(() => renderShims(catalog({ real: '/usr/bin/id' }), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
});

t.test('a tls provider\'s shim: HTTPS_PROXY and every CA bundle variable, its own placeholder', async (t) => {
  const tls: Catalog = {
    gh: {
      mode: 'tls',
      hosts: ['api.github.com'],
      tokenFile: '/var/lib/agent-connectors/cli-proxy/gh.token',
      inject: { type: 'header', name: 'Authorization', value: 'token {token}' },
      placeholder: 'ghp_agentconnectors000000000000000000000',
      commands: [{ name: 'gh', env: { GH_TOKEN: '{placeholder}' } }],
    },
  };
  const [shim] = renderShims(tls, '/opt/shims', 'http://127.0.0.1:14324/', '/opt/ca/ca-bundle.pem');
  const script = shim?.script ?? '';
  t.match(script, `  GH_TOKEN='ghp_agentconnectors000000000000000000000' \\\n`);
  for (const v of ['HTTPS_PROXY', 'https_proxy']) t.match(script, `  ${v}='http://127.0.0.1:14324' \\\n`);
  for (const v of ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO']) {
    t.match(script, `  ${v}='/opt/ca/ca-bundle.pem' \\\n`, v);
  }
  // aws-sdk-go v1 refuses to start with it when the CLI brings its own transport (rclone).
  t.notMatch(script, 'AWS_CA_BUNDLE', 'no AWS_CA_BUNDLE: botocore reads REQUESTS_CA_BUNDLE');
  t.throws(() => renderShims(catalog({ SSL_CERT_FILE: '/tmp/evil.pem' }), '/opt/shims', 'http://127.0.0.1:14324', B), /catalog rules/, 'a catalog cannot name the bundle itself');
  const [plain] = renderShims(catalog({ T: '{placeholder}' }), '/opt/shims', 'http://127.0.0.1:14324', B);
  t.notMatch(plain?.script ?? '', 'HTTPS_PROXY', 'a base-url provider\'s shim sets no proxy');
  t.match(plain?.script ?? '', `T='${PLACEHOLDER}'`, 'and keeps the fixed placeholder');
});

/** The demo provider with one command `fx` that has `args` (and an optional provider port). */
function withArgs(args: string[], port?: number): Catalog {
  const c = catalog({});
  const demo = c.demo;
  if (!demo) throw new Error('no demo provider');
  return { demo: { ...demo, ...(port === undefined ? {} : { port }), placeholder: 'pk_test_0000', commands: [{ name: 'fx', env: {}, args }] } };
}

t.test('args: each a single-quoted word between the real command and "$@", {baseUrl} and {placeholder} expanded', async (t) => {
  const [shim] = renderShims(withArgs(['--api-base', '{baseUrl}', '--api-key={placeholder}']), '/opt/shims', 'http://127.0.0.1:4000', B);
  t.match(shim?.script ?? '', /\nexec \/usr\/bin\/env -- "\$__ac_real" '--api-base' 'http:\/\/127\.0\.0\.1:4000\/p\/demo' '--api-key=pk_test_0000' "\$@"\n$/);
});

t.test('args reach the real command verbatim, before the agent\'s own (sh runs it)', async (t) => {
  const base = tempDir('ac-render-args-', t);
  const shimDir = join(base, 'shims');
  const binDir = join(base, 'bin');
  mkdirSync(shimDir);
  mkdirSync(binDir);
  // One argument per line: shows where each word starts and ends.
  writeFileSync(join(binDir, 'fx'), '#!/bin/sh\nfor a in "$@"; do printf "<%s>\\n" "$a"; done\n', { mode: 0o755 });
  const [shim] = renderShims(withArgs(['--base', '{baseUrl}', TRICKY, '', '{placeholder}']), shimDir, 'http://127.0.0.1:4000', B);
  writeFileSync(join(shimDir, 'fx'), shim?.script ?? '', { mode: 0o755 });
  const out = execFileSync('/bin/sh', [join(shimDir, 'fx'), 'a b', '-x'], { env: { PATH: `${shimDir}:${binDir}:/usr/bin:/bin`, HOME: base }, encoding: 'utf8' });
  t.equal(out, ['--base', 'http://127.0.0.1:4000/p/demo', TRICKY, '', 'pk_test_0000', 'a b', '-x'].map((a) => `<${a}>\n`).join(''));
});

t.test('a provider port: {baseUrl} is http://127.0.0.1:<port>, with no path', async (t) => {
  const [shim] = renderShims(withArgs(['{baseUrl}'], 18301), '/opt/shims', 'http://127.0.0.1:4000', B);
  t.match(shim?.script ?? '', `"$__ac_real" 'http://127.0.0.1:18301' "$@"`);
});

t.test('the renderer refuses args the catalog rules refuse', async (t) => {
  t.throws(() => renderShims(withArgs(['a\nb']), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
  t.throws(() => renderShims(withArgs(['a\0b']), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
  t.throws(() => renderShims(withArgs(Array.from({ length: 17 }, () => 'x')), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
  t.throws(() => renderShims(withArgs(['x'.repeat(1025)]), '/opt/shims', 'http://127.0.0.1:4000', B), /catalog rules/);
});
