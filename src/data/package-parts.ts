import { join } from 'node:path';
import { APPLY_UNIT, CLI_PROXY_UNIT, FORWARDER_UNIT, LINK_UNIT } from './unit-names.js';

/**
 * What an installed package is made of: `install` and the .deb copy these whole into the
 * package directory and replace them on upgrade, so nothing of the host's (a shim
 * directory, state) may live inside them. In a checkout `npm ci`, `npm run build` and a
 * pull replace the same ones.
 */
export const PACKAGE_PARTS = ['package.json', 'README.md', 'docs', 'dist', 'shims', 'units', 'node_modules'] as const;

/**
 * `dev` (the demo platform, its demo Gateway and demo CLI) is for a clone, not for a host:
 * an installed package ships none of it, and none of the MCP SDK that only it uses.
 */
export const NOT_SHIPPED = [join('dist', 'dev')] as const;

/** The long-running parts, each its own process under its own unit. */
export const PART_NAMES = ['forwarder', 'cli-proxy', 'link', 'apply'] as const;
export type PartName = (typeof PART_NAMES)[number];

export const PART_UNITS: Readonly<Record<PartName, string>> = {
  forwarder: FORWARDER_UNIT,
  'cli-proxy': CLI_PROXY_UNIT,
  link: LINK_UNIT,
  apply: APPLY_UNIT,
};

/**
 * Node's own flags for each part: the one place they are decided. Each unit's ExecStart=
 * carries them literally (`@NODE@ <flags> @LIBDIR@/dist/cli.js …`, so an operator reads
 * what runs; test/install/systemd-units.test.ts fails when a unit and this list disagree),
 * and the benches start each part with the flags of the build they run
 * (bench/lib/proc.ts `partNodeFlags`), so a figure is of what ships. Why these values:
 * docs/units.md, "Node flags".
 */
export const PART_NODE_FLAGS: Readonly<Record<PartName, readonly string[]>> = {
  forwarder: ['--max-semi-space-size=1'],
  'cli-proxy': ['--max-semi-space-size=1'],
  link: [],
  apply: [],
};
