import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
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
