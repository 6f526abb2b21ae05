import type { CliCase } from './cli-case.js';
import { fakeS3 } from './fake-s3.js';

/**
 * s3cmd (Debian's 2.3, Python) against S3 with `aws-sigv4`, in base-url mode on a
 * provider port. TLS mode cannot serve it: s3cmd ignores HTTPS_PROXY and takes a proxy
 * only from its config file (`proxy_host`, `proxy_port`), which a catalog cannot write.
 * What a catalog can give it: the placeholder key in `AWS_ACCESS_KEY_ID` /
 * `AWS_SECRET_ACCESS_KEY` (read when the config names no key) and arguments —
 * `--config=/dev/null` (s3cmd refuses to start without a config file; an empty one is
 * enough), `--host`/`--host-bucket` at the provider port (s3cmd keeps only host:port, so a
 * `/p/<provider>` path is out), `--no-ssl` (to the loopback proxy). The proxy signs again
 * with the real key for the upstream's host and region (s3cmd signs for us-east-1 at an
 * address it does not know).
 */
const REGION = 'eu-north-1';
const BUCKET = 'ac-gate-s3cmd';
const REAL = { accessKeyId: 'AKIAREALGATES3CMD001', secretAccessKey: 'RealGateSecret/s3cmd+0000000000000000000000' };
const PLACEHOLDER = 'AKIAPLACEHOLDER00000';
/** In the provider-port range (docs/shims.md); one provider per port. */
const PORT = 18391;
const s3 = fakeS3({ ...REAL, region: REGION, bucket: BUCKET });

export const s3cmdCase: CliCase = {
  name: 's3cmd',
  install: { apt: 's3cmd', bin: '/usr/bin/s3cmd' },
  versionArgs: ['--version'],
  providerId: 'aws-s3cmd',
  provider: {
    upstream: `https://s3.${REGION}.amazonaws.com`,
    port: PORT,
    inject: { type: 'aws-sigv4' },
    placeholder: PLACEHOLDER,
    commands: [
      {
        name: 's3cmd',
        env: { AWS_ACCESS_KEY_ID: '{placeholder}', AWS_SECRET_ACCESS_KEY: '{placeholder}' },
        args: ['--config=/dev/null', `--host=127.0.0.1:${PORT}`, `--host-bucket=127.0.0.1:${PORT}`, '--no-ssl'],
      },
    ],
  },
  token: JSON.stringify(REAL),
  secrets: [REAL.secretAccessKey],
  // Path-style only (--host-bucket without %(bucket)s): the region's S3 endpoint.
  hosts: s3.hosts.filter((h) => h === `s3.${REGION}.amazonaws.com`),
  serve: s3.serve,
  steps: [
    { script: 's3cmd ls', expect: new RegExp(`\\ss3://${BUCKET}$`, 'm') },
    { script: `seq 1 30000 > up.txt && s3cmd put up.txt s3://${BUCKET}/dir/up.txt && s3cmd ls s3://${BUCKET}/dir/`, expect: new RegExp(`\\s168894\\s+s3://${BUCKET}/dir/up\\.txt$`, 'm') },
  ],
  command: 's3cmd ls, s3cmd put (160 KiB) and s3cmd ls of it',
};
