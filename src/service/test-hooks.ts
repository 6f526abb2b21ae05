/**
 * Fault-injection points for the crash-safety tests, enabled only by listing them in
 * AGENT_CONNECTORS_TEST_HOOKS (comma-separated, e.g. `crash:fetch-after-persist`). A
 * crash point SIGKILLs the process right there, exactly as a power cut or OOM kill would:
 * no finally blocks, no flush. Unset in production, each check is one Set lookup.
 */
const enabled = new Set(
  (process.env.AGENT_CONNECTORS_TEST_HOOKS ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean),
);

export function crashPoint(name: string): void {
  if (enabled.has(`crash:${name}`)) process.kill(process.pid, 'SIGKILL');
}

export function hookEnabled(name: string): boolean {
  return enabled.has(name);
}
