/**
 * The TLS-mode bench's lab: a test CA and one https upstream child (a fake SaaS) whose
 * certificate names every bench host and 127.0.0.1, so the same process answers direct
 * clients, base-url mode (`https://127.0.0.1:<port>`) and TLS mode (through `--resolve`).
 */
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { ChildProcess } from 'node:child_process';
import { spawnTracked, stopChild } from './proc.js';
import { JSON_RESPONSE } from './wire.js';

/** Every bench host is under this name (the catalog's one wildcard entry). */
export const BENCH_DOMAIN = 'tls-bench.test';

/** Writes `ca.key`, `ca.pem`, `upstream.key`, `upstream.pem` in `dir` (openssl, P-256, as a lab would). */
export function makeLabPki(dir: string): { ca: string; key: string; cert: string } {
  const ca = join(dir, 'ca.pem');
  const caKey = join(dir, 'ca.key');
  const key = join(dir, 'upstream.key');
  const cert = join(dir, 'upstream.pem');
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  execFileSync('openssl', ['req', '-x509', ...ec, '-keyout', caKey, '-out', ca, '-days', '2', '-subj', '/CN=tls bench CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'], { stdio: 'pipe' });
  const ext = join(dir, 'upstream.ext');
  writeFileSync(ext, `subjectAltName=DNS:*.${BENCH_DOMAIN},IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n`);
  const csr = join(dir, 'upstream.csr');
  execFileSync('openssl', ['req', ...ec, '-keyout', key, '-out', csr, '-subj', `/CN=api.${BENCH_DOMAIN}`], { stdio: 'pipe' });
  execFileSync('openssl', ['x509', '-req', '-in', csr, '-CA', ca, '-CAkey', caKey, '-set_serial', String(Date.now()), '-days', '2', '-extfile', ext, '-out', cert], { stdio: 'pipe' });
  return { ca, key, cert };
}

/**
 * The fake SaaS: answers every request with the bench's 1 KB JSON and, in a header, how
 * many TLS handshakes it has done so far (to see whether a proxy reuses its upstream
 * connections). Keep-alive long enough that no idle connection is cut during a batch.
 */
const UPSTREAM = `
const https = require('https');
const fs = require('fs');
const [key, cert] = process.argv.slice(1);
const body = Buffer.from(process.env.BENCH_BODY, 'base64');
let handshakes = 0;
const server = https.createServer({ key: fs.readFileSync(key), cert: fs.readFileSync(cert) }, (req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length, 'x-request-id': 'handshakes-' + handshakes });
    res.end(body);
  });
});
server.on('secureConnection', () => void handshakes++);
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\\n'));
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

export interface LabUpstream {
  port: number;
  child: ChildProcess;
  stop(): Promise<void>;
}

export async function startLabUpstream(key: string, cert: string): Promise<LabUpstream> {
  const child = spawnTracked(process.execPath, ['-e', UPSTREAM, key, cert], {
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, BENCH_BODY: JSON_RESPONSE.toString('base64') },
  });
  const port = await new Promise<number>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once('line', (l) => resolve((JSON.parse(l) as { port: number }).port));
    child.once('exit', (code) => reject(new Error(`the bench upstream exited ${String(code)} before listening`)));
  });
  return {
    port,
    child,
    stop: async () => {
      child.stdin?.end();
      await stopChild(child);
    },
  };
}
