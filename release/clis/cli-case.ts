import type { IncomingMessage, ServerResponse } from 'node:http';

/**
 * One real CLI in the CLI gate (issue 20 item 6): how its users install it, the catalog
 * entry that serves it, the fake of its SaaS (the only fake: the CLI itself is the real,
 * unchanged binary) and what the agent UID runs through its shim.
 */
export interface CliCase {
  /** The row in the table (docs/real-clis.md) and the name `npm run gates -- --only clis:<name>` takes. */
  name: string;
  /**
   * How its users install it: a Debian package (`.ci/run` installs it; `bin` is its path,
   * e.g. `/usr/bin/gh`) or an npm package pinned exactly, installed by the gate into its
   * cache (`bin` is the name under `node_modules/.bin`).
   */
  install: { apt: string; bin: string } | { npm: string; version: string; bin: string };
  /** Arguments that make it print its version, for the table. */
  versionArgs: readonly string[];
  /** The provider's id in the catalog. */
  providerId: string;
  /** The provider's catalog entry without `tokenFile` (the gate adds it). */
  provider: Record<string, unknown>;
  /** What the provider's token file holds: the real credential (JSON text for aws-sigv4). */
  token: string;
  /** Every string that must never reach the agent UID (the token, a secret key, ...). */
  secrets: readonly string[];
  /**
   * The real host names the fake SaaS answers under: its certificate's names, and the
   * cli-proxy's `--resolve` entries (port 443) to the fake's loopback port.
   */
  hosts: readonly string[];
  /**
   * The fake SaaS, as far as the steps call it. It answers only a request that carries the
   * real credential (anything else: the SaaS's own 401/403), so a green run proves the
   * injection. `body` is the whole request body.
   */
  serve(req: IncomingMessage, body: Buffer, res: ServerResponse): void;
  /**
   * What the agent UID runs, one `sh -c` script per step, in a scratch HOME, with the shim
   * directory first on PATH. Each step must exit 0 and its stdout match `expect`.
   */
  steps: ReadonlyArray<{ script: string; expect: RegExp; env?: Readonly<Record<string, string>> }>;
  /** The table's description of what the steps do ("gh repo list", "s3 ls and an upload"). */
  command: string;
  /**
   * Prepares what the fake serves before it starts (a bare repository to clone, ...), in
   * `dir`, a fresh directory of root's that the agent UID cannot read. Optional.
   */
  setup?(dir: string): void | Promise<void>;
  /** Environment every step gets on top of PATH and HOME (a region, a pager off, ...). */
  env?: Readonly<Record<string, string>>;
}
