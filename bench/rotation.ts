import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The rotation run of docs/rotation.md at full size: the strict-Gateway load test of
 * contract-tests/renew-e2e.test.ts (real fetch + apply --watch + forwarder, JSON and SSE
 * calls) with 1 000 rotations instead of `npm test`'s 100. Its figures (rotations,
 * requests, failures, the mint → rename window, the latency of requests that met a
 * rotation) are printed as the test's comments. Exit code: tap's.
 */
export async function runRotation(log: (line: string) => void, rotations = 1000): Promise<number> {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
  log(`rotation: ${rotations} rotations against the strict Gateway (several minutes)`);
  const child = spawn(join(root, 'node_modules/.bin/tap'), ['--timeout', '1800', join(root, 'build/contract-tests/renew-e2e.test.js')], {
    cwd: root,
    env: { ...process.env, RENEW_E2E_ROTATIONS: String(rotations) },
    stdio: 'inherit',
  });
  const [code] = (await once(child, 'exit')) as [number | null];
  return code ?? 1;
}
