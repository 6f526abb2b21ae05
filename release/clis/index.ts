import type { CliCase } from './cli-case.js';
import { curl } from './curl.js';
import { gh } from './gh.js';
import { gitHttps } from './git.js';
import { httpie } from './httpie.js';

/**
 * Every case of the CLI gate (release/cli-gate.ts), in the order the table lists them. One
 * import and one entry per case, so branches adding cases merge without conflicts.
 */
export const CLI_CASES: readonly CliCase[] = [
  curl,
  gh,
  gitHttps,
  httpie,
];
