import { awsCase } from './aws.js';
import type { CliCase } from './cli-case.js';
import { curl } from './curl.js';
import { gh } from './gh.js';
import { gitHttps } from './git.js';
import { hcloudCase } from './hcloud.js';
import { heroku } from './heroku.js';
import { httpie } from './httpie.js';
import { netlify } from './netlify.js';
import { rcloneCase } from './rclone.js';
import { s3cmdCase } from './s3cmd.js';
import { sentryCli } from './sentry-cli.js';
import { vercel } from './vercel.js';
import { wrangler } from './wrangler.js';

/**
 * Every case of the CLI gate (release/cli-gate.ts), in the order the table lists them. One
 * import and one entry per case, so branches adding cases merge without conflicts.
 */
export const CLI_CASES: readonly CliCase[] = [
  curl,
  gh,
  gitHttps,
  httpie,
  awsCase,
  s3cmdCase,
  rcloneCase,
  hcloudCase,
  wrangler,
  netlify,
  vercel,
  heroku,
  sentryCli,
];
