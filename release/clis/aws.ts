import type { CliCase } from './cli-case.js';
import { fakeS3 } from './fake-s3.js';

/**
 * The AWS CLI (Debian's awscli) in TLS mode with `aws-sigv4`: it signs with the
 * placeholder key, the proxy signs again with the real one; the fake S3/STS verifies
 * SigV4 against the real key. The upload is over the proxy's replay limit, so it streams.
 */
const REGION = 'eu-west-1';
const BUCKET = 'ac-gate-aws';
const REAL = { accessKeyId: 'AKIAREALGATEAWS00001', secretAccessKey: 'RealGateSecret/aws+0000000000000000000000' };
const PLACEHOLDER = 'AKIAPLACEHOLDER00000';
const s3 = fakeS3({ ...REAL, region: REGION, bucket: BUCKET });

export const awsCase: CliCase = {
  name: 'aws',
  install: { apt: 'awscli', bin: '/usr/bin/aws' },
  versionArgs: ['--version'],
  providerId: 'aws',
  provider: {
    mode: 'tls',
    hosts: [`s3.${REGION}.amazonaws.com`, `*.s3.${REGION}.amazonaws.com`, `sts.${REGION}.amazonaws.com`],
    inject: { type: 'aws-sigv4' },
    placeholder: PLACEHOLDER,
    commands: [{ name: 'aws', env: { AWS_ACCESS_KEY_ID: '{placeholder}', AWS_SECRET_ACCESS_KEY: '{placeholder}' } }],
  },
  token: JSON.stringify(REAL),
  secrets: [REAL.secretAccessKey],
  hosts: s3.hosts,
  serve: s3.serve,
  steps: [
    { script: 'aws s3 ls', expect: new RegExp(`\\b${BUCKET}\\b`) },
    // 160 KiB: over the proxy's 64 KiB replay limit, so the body streams through.
    { script: `seq 1 30000 > up.txt && aws s3 cp up.txt "s3://${BUCKET}/dir/up load.txt" && aws s3 ls "s3://${BUCKET}/dir/"`, expect: /\b168894 up load\.txt/ },
    { script: 'aws sts get-caller-identity --output text --query Account', expect: /^123456789012$/m },
  ],
  command: 'aws s3 ls, aws s3 cp (160 KiB, streamed), aws sts get-caller-identity',
  env: { AWS_DEFAULT_REGION: REGION, AWS_EC2_METADATA_DISABLED: 'true', AWS_PAGER: '' },
};
