import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TapTest } from './tap.js';

/**
 * A fresh directory under the OS temp dir. Given a test, it is removed at that test's
 * teardown; without one it is left for the OS (processes may still write into it).
 */
export function tempDir(prefix = 'ac-test-', t?: TapTest): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t?.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
