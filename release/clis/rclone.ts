import type { CliCase } from './cli-case.js';
import { fakeS3 } from './fake-s3.js';

/**
 * rclone (Debian's, Go) against S3 in TLS mode with `aws-sigv4`. A named remote would be
 * `RCLONE_CONFIG_<NAME>_TYPE=s3`, `…_ACCESS_KEY_ID`…, but every `*CONFIG*` name is on the
 * catalog's deny list (src/data/catalog-rules.ts), rightly: those names define whole
 * remotes of any backend and where rclone reads its configuration. The backend's own
 * defaults (`RCLONE_S3_*`, rclone's flag-as-environment names) pass the rules and serve
 * the on-the-fly remote `:s3:`, so the agent runs `rclone lsd :s3:`.
 */
const REGION = 'eu-central-1';
const BUCKET = 'ac-gate-rclone';
const REAL = { accessKeyId: 'AKIAREALGATERCLONE01', secretAccessKey: 'RealGateSecret/rclone+00000000000000000000' };
const PLACEHOLDER = 'AKIAPLACEHOLDER00000';
const s3 = fakeS3({ ...REAL, region: REGION, bucket: BUCKET });

export const rcloneCase: CliCase = {
  name: 'rclone',
  install: { apt: 'rclone', bin: '/usr/bin/rclone' },
  versionArgs: ['version'],
  providerId: 'aws-rclone',
  provider: {
    mode: 'tls',
    hosts: [`s3.${REGION}.amazonaws.com`, `*.s3.${REGION}.amazonaws.com`],
    inject: { type: 'aws-sigv4' },
    placeholder: PLACEHOLDER,
    commands: [
      {
        name: 'rclone',
        env: { RCLONE_S3_PROVIDER: 'AWS', RCLONE_S3_REGION: REGION, RCLONE_S3_ACCESS_KEY_ID: '{placeholder}', RCLONE_S3_SECRET_ACCESS_KEY: '{placeholder}' },
      },
    ],
  },
  token: JSON.stringify(REAL),
  secrets: [REAL.secretAccessKey],
  hosts: s3.hosts.filter((h) => !h.startsWith('sts.')),
  serve: s3.serve,
  steps: [
    { script: 'rclone lsd :s3:', expect: new RegExp(`\\s${BUCKET}$`, 'm') },
    { script: `seq 1 30000 > up.txt && rclone copy up.txt :s3:${BUCKET}/dir && rclone ls :s3:${BUCKET}/dir`, expect: /^\s*168894 up\.txt$/m },
  ],
  command: 'rclone lsd :s3:, rclone copy (160 KiB) and rclone ls',
};
