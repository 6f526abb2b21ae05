import { X509Certificate } from 'node:crypto';
import { lstat, readFile, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { CA_BUNDLE_STALE, CA_BUNDLE_UNREADABLE, CLI_CA_CERT_INVALID, CLI_CA_EXPIRING, CLI_CA_KEY_EXPOSED, CLI_CA_MISSING } from '../data/problem-codes.js';
import { CA_CERT_FILE, CA_FILE, CA_RENEW_BEFORE_MS } from '../data/state-layout.js';
import { CLI_PROXY_UNIT, unitStem } from '../data/unit-names.js';
import type { Findings } from './finding.js';

/**
 * doctor's checks of TLS mode's trust (SPEC §10, docs/design/tls-mode.md): the host's CLI
 * CA — its key the cli-proxy's user's alone, its certificate a CA still valid — and the
 * shims' CA bundle every agent's CLI verifies with: there, readable by every agent, and
 * holding that CA. The cli-proxy writes all three at its start, so most fixes restart it.
 */

export interface CliCaCheckOptions {
  /** The CA's directory (`<state>/cli-ca`). */
  dir: string;
  /** The shims' CA bundle. */
  bundle: string;
  /** The cli-proxy's user (undefined: the account is missing, reported elsewhere). */
  uid: number | undefined;
  now: number;
}

const RESTART = `systemctl restart ${unitStem(CLI_PROXY_UNIT)}`;

const mode = (m: number): string => (m & 0o7777).toString(8);

/** The first of `path`'s directories, from the top, that a user of no group of its own cannot enter. */
async function closedDirectory(path: string): Promise<string | undefined> {
  const dirs: string[] = [];
  for (let d = dirname(path); ; d = dirname(d)) {
    dirs.unshift(d);
    if (dirname(d) === d) break;
  }
  for (const d of dirs) {
    const st = await stat(d).catch(() => undefined);
    if (!st || (st.mode & 0o001) === 0) return d;
  }
  return undefined;
}

/** The CA's key and certificate; the certificate's PEM when it is readable (to find it in the bundle). */
async function caChecks(o: CliCaCheckOptions, out: Findings): Promise<{ key?: string; cert?: string }> {
  const key = join(o.dir, CA_FILE);
  const dirSt = await stat(o.dir).catch(() => undefined);
  const keySt = await lstat(key).catch(() => undefined);
  if (!dirSt || !keySt) {
    out.warn(CLI_CA_MISSING, 'cli ca', `${dirSt ? key : o.dir} does not exist: the cli-proxy makes the CLI CA at its start, and TLS mode serves no CLI until then`, RESTART);
    return {};
  }
  if ((dirSt.mode & 0o7777) !== 0o700) out.problem('directory_mode', 'cli ca', `${o.dir} has mode ${mode(dirSt.mode)}, expected 700`, `chmod 700 ${o.dir}`);
  else if (o.uid !== undefined && dirSt.uid !== o.uid) out.problem('directory_owner', 'cli ca', `${o.dir} is not owned by agent-connectors`, `chown agent-connectors:agent-connectors ${o.dir}`);
  // Not a chmod: a key others could read, or that another user wrote, may be known; only a new CA helps.
  const why = !keySt.isFile()
    ? 'is not a regular file'
    : (keySt.mode & 0o077) !== 0
      ? `has mode ${mode(keySt.mode)}`
      : o.uid !== undefined && keySt.uid !== o.uid
        ? `is owned by uid ${keySt.uid}, not agent-connectors`
        : undefined;
  if (why) out.problem(CLI_CA_KEY_EXPOSED, 'cli ca', `${key} ${why}: the CLI CA's private key may be known to others, and the cli-proxy refuses to start with it`, `rm ${key} && ${RESTART} (a new CA; the shims' bundle gets it)`);
  else out.ok('cli ca', `${key} 600, the cli-proxy's user alone`);

  // The key file holds the certificate in force (doctor runs as root); ca-cert.pem is its
  // copy, rewritten at each start, and the bundle must hold that one.
  const inForce = why ? undefined : (await readFile(key, 'utf8').catch(() => undefined))?.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/)?.[0];
  const certPath = join(o.dir, CA_CERT_FILE);
  const certText = await readFile(certPath, 'utf8').catch(() => undefined);
  let cert: X509Certificate | undefined;
  try {
    cert = certText === undefined ? undefined : new X509Certificate(certText);
  } catch {
    cert = undefined;
  }
  if (!cert || certText === undefined) {
    out.problem(CLI_CA_CERT_INVALID, 'cli ca', `${certPath} ${certText === undefined ? 'does not exist' : 'is not a certificate'}`, RESTART);
    return { key, cert: inForce };
  }
  const notAfter = Date.parse(cert.validTo);
  if (!cert.ca) out.problem(CLI_CA_CERT_INVALID, 'cli ca', `${certPath} is not a CA certificate (no CA:TRUE): no CLI accepts the leaves it signs`, `rm ${key} && ${RESTART}`);
  else if (notAfter <= o.now || Date.parse(cert.validFrom) > o.now) out.problem(CLI_CA_CERT_INVALID, 'cli ca', `${certPath} is not valid now (${cert.validFrom} to ${cert.validTo})`, `${RESTART} (it replaces a CA near its end)`);
  else if (inForce !== undefined && inForce !== certText.trim()) out.problem(CLI_CA_CERT_INVALID, 'cli ca', `${certPath} is not the certificate of the CA in ${key}`, RESTART);
  else if (notAfter - o.now < CA_RENEW_BEFORE_MS) out.warn(CLI_CA_EXPIRING, 'cli ca', `the CLI CA ends ${cert.validTo}: the cli-proxy replaces it at its next start`, RESTART);
  else out.ok('cli ca', `${certPath}: a CA valid until ${cert.validTo}`);
  return { key, cert: inForce ?? certText };
}

async function bundleChecks(o: CliCaCheckOptions, caCert: string | undefined, out: Findings): Promise<void> {
  const st = await stat(o.bundle).catch(() => undefined);
  if (!st) {
    out.problem(CA_BUNDLE_STALE, 'ca bundle', `${o.bundle} does not exist: TLS-mode CLIs cannot verify the cli-proxy`, RESTART);
    return;
  }
  const closed = await closedDirectory(o.bundle);
  if ((st.mode & 0o444) !== 0o444) out.problem(CA_BUNDLE_UNREADABLE, 'ca bundle', `${o.bundle} has mode ${mode(st.mode)}: agents cannot read it, so their TLS-mode CLIs fail`, `chmod 644 ${o.bundle}`);
  else if (closed) out.problem(CA_BUNDLE_UNREADABLE, 'ca bundle', `${closed} cannot be entered by other users: agents cannot read ${o.bundle}`, `chmod o+x ${closed}`);
  else if (caCert !== undefined && !(await readFile(o.bundle, 'utf8')).includes(caCert.trim()))
    out.problem(CA_BUNDLE_STALE, 'ca bundle', `${o.bundle} does not hold the CLI CA's certificate: TLS-mode CLIs will refuse the cli-proxy`, `${RESTART} (it rewrites the bundle)`);
  else out.ok('ca bundle', `${o.bundle} readable by every agent${caCert === undefined ? '' : ', holds the CLI CA'}`);
}

/** Returns the CA's key file when it exists, for the check that no agent can read a secret. */
export async function cliCaChecks(o: CliCaCheckOptions, out: Findings): Promise<string[]> {
  const { key, cert } = await caChecks(o, out);
  if (key === undefined) return [];
  await bundleChecks(o, cert, out);
  return [key];
}
