import { join } from 'node:path';

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
