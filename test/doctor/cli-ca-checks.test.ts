/**
 * doctor's checks of TLS mode's trust (SPEC §10: "where the host's CLI CA and the shims'
 * CA bundle live is … checked by doctor"): the CA as the cli-proxy's own code makes it
 * (openCliCa), then each fault seeded on real files and modes. Where a fix says "restart",
 * openCliCa (what the cli-proxy does at its start) is run and the problem must be gone.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, chownSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { createCa, issueLeaf, loadCa } from '../../src/cli-proxy/certificates.js';
import { openCliCa, systemCaText } from '../../src/cli-proxy/cli-ca.js';
import { cliCaChecks, type CliCaCheckOptions } from '../../src/doctor/cli-ca-checks.js';
import { Findings, type Finding } from '../../src/doctor/finding.js';
import { ConfigError } from '../../src/errors.js';
import { memoryLogger } from '../support/memory-log.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

const DAY = 86_400_000;
const RESTART = 'systemctl restart agent-connectors-cli-proxy';
const own = process.getuid?.() ?? 0;
const { log } = memoryLogger();

interface Lab {
  opts: CliCaCheckOptions;
  key: string;
  cert: string;
  /** What the cli-proxy does at its start. */
  start: (now?: Date) => Promise<unknown>;
}

/** A CA made by the cli-proxy's code, its bundle in a 0755 directory under a 0755 base. */
async function lab(tt: TapTest, made: Date | null = new Date()): Promise<Lab> {
  const base = tempDir('ac-doctor-ca-', tt);
  chmodSync(base, 0o755);
  const paths = { dir: join(base, 'cli-ca'), bundle: join(base, 'ca', 'ca-bundle.pem') };
  const start = (now?: Date): Promise<unknown> => openCliCa(paths, log, now);
  if (made) await start(made);
  return { opts: { ...paths, uid: own, now: Date.now() }, key: join(paths.dir, 'ca.pem'), cert: join(paths.dir, 'ca-cert.pem'), start };
}

async function check(l: Lab): Promise<{ findings: Finding[]; secrets: string[] }> {
  const out = new Findings();
  const secrets = await cliCaChecks({ ...l.opts, now: Date.now() }, out);
  return { findings: out.list, secrets };
}

const notOk = (f: Finding[]): Finding[] => f.filter((x) => x.level !== 'ok');

/** The one non-ok finding, with its code and fix. */
function only(tt: TapTest, findings: Finding[], code: string, detail: RegExp): Finding | undefined {
  const bad = notOk(findings);
  tt.equal(bad.length, 1, `one finding (got ${JSON.stringify(bad)})`);
  tt.equal(bad[0]?.code, code);
  tt.match(bad[0]?.detail ?? '', detail);
  tt.ok((bad[0]?.fix ?? '').length > 0, 'with a fix');
  return bad[0];
}

t.test('a CA as the cli-proxy makes it: key, certificate and bundle ok; the key is returned as a secret', async (tt) => {
  const l = await lab(tt);
  const { findings, secrets } = await check(l);
  tt.same(notOk(findings), []);
  tt.same(findings.map((f) => f.check), ['cli ca', 'cli ca', 'ca bundle']);
  tt.match(findings[2]?.detail ?? '', /readable by every agent, holds the CLI CA$/);
  tt.same(secrets, [l.key], 'the key joins the files no agent may read');
});

t.test('no CA yet (the cli-proxy never started): a warning to start it, nothing else checked', async (tt) => {
  const l = await lab(tt, null);
  const { findings, secrets } = await check(l);
  tt.equal(only(tt, findings, 'cli_ca_missing', /does not exist: the cli-proxy makes the CLI CA at its start/)?.level, 'warn');
  tt.equal(findings[0]?.fix, RESTART);
  tt.same(secrets, []);
  await l.start();
  tt.same(notOk((await check(l)).findings), [], 'started: no finding');
});

t.test('a key others may have read or written: cli_ca_key_exposed, fixed by a new CA (not a chmod)', async (tt) => {
  const seeds: Array<[string, (key: string) => void, RegExp]> = [
    ['mode 0640', (key) => chmodSync(key, 0o640), /has mode 640: the CLI CA's private key may be known/],
    ['mode 0604', (key) => chmodSync(key, 0o604), /has mode 604/],
  ];
  if (own === 0) seeds.push(['owned by another user', (key) => chownSync(key, 65534, 65534), /is owned by uid 65534, not agent-connectors/]);
  for (const [what, seed, detail] of seeds) {
    const l = await lab(tt);
    seed(l.key);
    const f = only(tt, (await check(l)).findings, 'cli_ca_key_exposed', detail);
    tt.equal(f?.level, 'problem', what);
    tt.equal(f?.fix, `rm ${l.key} && ${RESTART} (a new CA; the shims' bundle gets it)`, `${what}: the fix`);
    await tt.rejects(l.start(), ConfigError, `${what}: as doctor says, the cli-proxy refuses to start with it`);
    rmSync(l.key);
    await l.start();
    tt.same(notOk((await check(l)).findings), [], `${what}: after the fix, no finding`);
  }
});

t.test('the CA directory not 0700: directory_mode with its chmod', async (tt) => {
  const l = await lab(tt);
  chmodSync(l.opts.dir, 0o755);
  const f = only(tt, (await check(l)).findings, 'directory_mode', /has mode 755, expected 700/);
  tt.equal(f?.fix, `chmod 700 ${l.opts.dir}`);
  spawnSync('/bin/sh', ['-c', f?.fix ?? 'false']);
  tt.same(notOk((await check(l)).findings), []);
});

t.test('the certificate expired, near its end, not a CA, or not the key file\'s: each said, and a start mends the first two', async (tt) => {
  const expired = await lab(tt, new Date(Date.now() - 3651 * DAY));
  const e = only(tt, (await check(expired)).findings, 'cli_ca_cert_invalid', /is not valid now/);
  tt.equal(e?.level, 'problem');
  tt.match(e?.fix ?? '', RESTART);
  await expired.start();
  tt.same(notOk((await check(expired)).findings), [], 'the start replaced it');

  const ending = await lab(tt, new Date(Date.now() - 3640 * DAY));
  const w = only(tt, (await check(ending)).findings, 'cli_ca_expiring', /the CLI CA ends .*: the cli-proxy replaces it at its next start/);
  tt.equal(w?.level, 'warn');
  await ending.start();
  tt.same(notOk((await check(ending)).findings), []);

  const leafCa = await lab(tt);
  const other = await createCa('other', 30);
  const leaf = await issueLeaf(await loadCa(other.cert, other.key), 'api.example.com', DAY);
  writeFileSync(leafCa.cert, leaf.cert);
  tt.equal(only(tt, (await check(leafCa)).findings, 'cli_ca_cert_invalid', /is not a CA certificate \(no CA:TRUE\)/)?.level, 'problem');

  const swapped = await lab(tt);
  writeFileSync(swapped.cert, other.cert);
  tt.match(only(tt, (await check(swapped)).findings, 'cli_ca_cert_invalid', /is not the certificate of the CA in /)?.fix ?? '', RESTART);
  await swapped.start();
  tt.same(notOk((await check(swapped)).findings), [], 'the start wrote it again');

  const garbage = await lab(tt);
  writeFileSync(garbage.cert, 'not a certificate\n');
  only(tt, (await check(garbage)).findings, 'cli_ca_cert_invalid', /is not a certificate$/);
});

t.test('the bundle missing, or without our CA: ca_bundle_stale, mended by a start', async (tt) => {
  const l = await lab(tt);
  rmSync(l.opts.bundle);
  tt.equal(only(tt, (await check(l)).findings, 'ca_bundle_stale', /does not exist: TLS-mode CLIs cannot verify the cli-proxy/)?.fix, RESTART);
  writeFileSync(l.opts.bundle, await systemCaText(), { mode: 0o644 });
  only(tt, (await check(l)).findings, 'ca_bundle_stale', /does not hold the CLI CA's certificate/);
  await l.start();
  tt.same(notOk((await check(l)).findings), []);
});

t.test('the bundle not readable by every agent (its mode, or a closed directory above it): ca_bundle_unreadable with the chmod that fixes it', async (tt) => {
  const l = await lab(tt);
  const asNobody = (): boolean =>
    spawnSync('/usr/bin/env', ['-i', 'setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups', '/bin/cat', l.opts.bundle], { cwd: '/', stdio: 'ignore' }).status === 0;
  for (const [what, seed, detail] of [
    ['file 0600', () => chmodSync(l.opts.bundle, 0o600), /has mode 600: agents cannot read it/],
    ['directory 0700', () => chmodSync(join(l.opts.bundle, '..'), 0o700), /cannot be entered by other users: agents cannot read /],
  ] as const) {
    seed();
    const f = only(tt, (await check(l)).findings, 'ca_bundle_unreadable', detail);
    if (own === 0) tt.notOk(asNobody(), `${what}: nobody really cannot read it`);
    tt.match(f?.fix ?? '', /^chmod (644|o\+x) \//, `${what}: a chmod`);
    spawnSync('/bin/sh', ['-c', f?.fix ?? 'false']);
    tt.same(notOk((await check(l)).findings), [], `${what}: fixed`);
    if (own === 0) tt.ok(asNobody(), `${what}: nobody reads it now`);
  }
  tt.match(readFileSync(l.opts.bundle, 'utf8'), /BEGIN CERTIFICATE/);
});
