import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The compiled bench directory (build/bench/ when run by `npm run bench` or the tests). */
export const BENCH_BUILD_DIR = resolve(fileURLToPath(new URL('.', import.meta.url)), '..');
/** The repository root: build/bench/ is two levels below it. */
export const REPO_ROOT = resolve(BENCH_BUILD_DIR, '../..');
/** `BENCH_CLI` set but empty counts as unset: `node ''` would start a REPL that exits 0 at once. */
export const DEFAULT_CLI = process.env.BENCH_CLI || resolve(REPO_ROOT, 'dist/cli.js');
export const RESULTS_DIR = resolve(REPO_ROOT, 'bench/results');
export const DOCS_FILE = resolve(REPO_ROOT, 'docs/performance.md');
export const UPSTREAM_JS = resolve(BENCH_BUILD_DIR, 'upstream.js');
export const IDLE_CLIENTS_JS = resolve(BENCH_BUILD_DIR, 'idle-clients.js');
export const FLOOR_PROXY_JS = resolve(BENCH_BUILD_DIR, 'floor-proxy.js');
export const MCP_SERVER_JS = resolve(BENCH_BUILD_DIR, 'mcp-server.js');
