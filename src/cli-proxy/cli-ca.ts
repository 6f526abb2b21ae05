import { closeSync, fsyncSync, linkSync, openSync, unlinkSync, writeSync, constants } from 'node:fs';
import { chmod, lstat, mkdir, readFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { dirname, join } from 'node:path';
import { rootCertificates } from 'node:tls';
import { CA_CERT_FILE, CA_FILE, CA_RENEW_BEFORE_MS } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { atomicWrite } from '../fs/atomic-write.js';
import type { Logger } from '../log/logger.js';
import { createCa, loadCa, type LoadedCa } from './certificates.js';

/**
 * The host's CLI CA (SPEC §10) on disk: `ca.pem` holds its private key and certificate
 * together (0600, in a 0700 directory: the cli-proxy's user alone), so a reader never sees
 * a key from one CA beside the certificate of another. `ca-cert.pem` is the public half.
 * The shims' bundle (the system's CAs plus ours, 0644) is what agents' CLIs verify with;
 * nothing goes into the system trust store.
 */

const CA_NAME = 'agent-connectors CLI CA';
const CA_VALID_DAYS = 3650;

/** Where the system's trust store is, by distribution (Debian/Ubuntu first). */
export const SYSTEM_CA_FILES = ['/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt', '/etc/ssl/ca-bundle.pem', '/etc/ssl/cert.pem'];

export interface CliCaPaths {
  /** The private directory: `ca.pem`, `ca-cert.pem`. */
  dir: string;
  /** The bundle the shims name (readable by agents). */
  bundle: string;
}

/** The system's CA certificates as PEM text; Node's own Mozilla list where the system has none. */
export async function systemCaText(files: readonly string[] = SYSTEM_CA_FILES): Promise<string> {
  for (const file of files) {
    const text = await readFile(file, 'utf8').catch(() => undefined);
    if (text?.includes('-----BEGIN CERTIFICATE-----')) return text.endsWith('\n') ? text : `${text}\n`;
  }
  return `${rootCertificates.join('\n')}\n`;
}

/**
 * Creates `path` with `data` only if it does not exist (write a temp file, link it into
 * place): two processes starting at once both end up using the one CA that won.
 */
function createExclusive(path: string, data: string, mode: number): boolean {
  const tmp = join(dirname(path), `.${randomBytes(6).toString('hex')}.tmp`);
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
  try {
    writeSync(fd, data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  try {
    linkSync(tmp, path);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  } finally {
    unlinkSync(tmp);
  }
}

/** Refuses a CA file another user could have read or replaced: its key may be known. */
async function checkPrivate(path: string): Promise<boolean> {
  const st = await lstat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  if (st === undefined) return false;
  const own = process.getuid?.();
  if (!st.isFile() || (own !== undefined && st.uid !== own) || (st.mode & 0o077) !== 0) {
    throw new ConfigError(`the CLI CA ${path} is not a 0600 file of this user: its key may be known to others; remove it and restart to make a new CA`);
  }
  return true;
}

/**
 * Loads the CLI CA, creating it the first time (or replacing one near its end), then
 * writes its public certificate and the shims' bundle. The directory is made 0700.
 */
export async function openCliCa(paths: CliCaPaths, log: Logger, now = new Date()): Promise<LoadedCa> {
  await mkdir(paths.dir, { recursive: true, mode: 0o700 });
  await chmod(paths.dir, 0o700);
  const file = join(paths.dir, CA_FILE);
  let ca: LoadedCa | undefined;
  if (await checkPrivate(file)) {
    const text = await readFile(file, 'utf8');
    ca = await loadCa(text, text).catch((err: unknown) => {
      throw new ConfigError(`the CLI CA ${file} cannot be used (${(err as Error).message}); remove it and restart to make a new CA`);
    });
    if (ca.notAfter.getTime() - now.getTime() < CA_RENEW_BEFORE_MS) {
      log.warn({ notAfter: ca.notAfter.toISOString() }, 'CLI CA near its end: making a new one (agents pick it up from the bundle)');
      const fresh = await createCa(CA_NAME, CA_VALID_DAYS, now);
      await atomicWrite(file, `${fresh.key}${fresh.cert}`, { mode: 0o600 });
      ca = await loadCa(fresh.cert, fresh.key);
    }
  } else {
    const fresh = await createCa(CA_NAME, CA_VALID_DAYS, now);
    if (createExclusive(file, `${fresh.key}${fresh.cert}`, 0o600)) log.info({ dir: paths.dir }, 'CLI CA created');
    await checkPrivate(file);
    const text = await readFile(file, 'utf8');
    ca = await loadCa(text, text);
  }
  await atomicWrite(join(paths.dir, CA_CERT_FILE), ca.cert, { mode: 0o644 });
  await writeBundle(paths.bundle, ca.cert);
  return ca;
}

/** The system's CAs plus ours, atomically, 0644 (every agent reads it). */
export async function writeBundle(path: string, caCert: string): Promise<void> {
  await mkdir(dirname(path), { recursive: true, mode: 0o755 });
  await atomicWrite(path, `${await systemCaText()}# agent-connectors CLI CA (TLS mode, SPEC §10)\n${caCert}`, { mode: 0o644 });
}
