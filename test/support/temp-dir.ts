import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TapTest } from './tap.js';

const leftForExit = new Set<string>();
let exitHooked = false;

function removeAtExit(dir: string): void {
  leftForExit.add(dir);
  if (exitHooked) return;
  exitHooked = true;
  // Each test file is its own process: what no test owned goes when the file's process
  // does, so repeated runs do not fill /tmp (a day of runs left 1.6 GB there).
  process.once('exit', () => {
    for (const d of leftForExit) {
      try {
        rmSync(d, { recursive: true, force: true });
      } catch {
        // A directory a test made read-only stays, as before: never fail a passing file at exit.
      }
    }
  });
}

/**
 * A fresh directory under the OS temp dir. Given a test, it is removed at that test's
 * teardown; without one, when the test file's process exits (processes it started may
 * still write into it until then).
 */
export function tempDir(prefix = 'ac-test-', t?: TapTest): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  if (t) t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  else removeAtExit(dir);
  return dir;
}
