import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tempDir } from './temp-dir.js';
import { join } from 'node:path';

/**
 * A lab's own CA for fake SaaS servers under real host names (TLS-mode contract tests):
 * the cli-proxy trusts it only through `--upstream-ca`. Writes `ca.key` and `ca.pem` in `dir`.
 */
export function makeTestCa(dir: string, cn: string): void {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', join(dir, 'ca.key'), '-out', join(dir, 'ca.pem'),
    '-days', '2', '-subj', `/CN=${cn}`, '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], { stdio: 'pipe' });
}

/** A server key and certificate for `hosts` (the first is the CN) from the CA in `dir`. */
export function issueServerCert(dir: string, name: string, hosts: readonly string[]): { key: Buffer; cert: Buffer } {
  const key = join(dir, `${name}.key`);
  const csr = join(dir, `${name}.csr`);
  const cert = join(dir, `${name}.pem`);
  const ext = join(dir, `${name}.ext`);
  writeFileSync(ext, `subjectAltName=${hosts.map((h) => `DNS:${h}`).join(',')}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n`);
  execFileSync('openssl', ['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', key, '-out', csr, '-subj', `/CN=${hosts[0] ?? name}`], { stdio: 'pipe' });
  execFileSync('openssl', ['x509', '-req', '-in', csr, '-CA', join(dir, 'ca.pem'), '-CAkey', join(dir, 'ca.key'), '-set_serial', String(Date.now()), '-days', '2', '-extfile', ext, '-out', cert], { stdio: 'pipe' });
  return { key: readFileSync(key), cert: readFileSync(cert) };
}

/**
 * The directories of a TLS-mode lab: a 0755 base (the agent UID reaches the shims and the
 * bundle), a 0700 state with its cli-proxy folder, a 0700 pki for the test CA; removed at teardown.
 */
export function tlsLabDirs(t: { teardown(fn: () => void): unknown }, prefix: string): { base: string; state: string; pki: string; shimDir: string; bundle: string } {
  const base = tempDir(prefix);
  chmodSync(base, 0o755);
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  const state = join(base, 'state');
  mkdirSync(join(state, 'cli-proxy'), { recursive: true, mode: 0o700 });
  chmodSync(state, 0o700);
  const pki = join(base, 'pki');
  mkdirSync(pki, { mode: 0o700 });
  // Apart from the shims, as on a system install: apply sweeps what it did not render there.
  return { base, state, pki, shimDir: join(base, 'shims'), bundle: join(base, 'ca', 'ca-bundle.pem') };
}
