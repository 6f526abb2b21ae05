/**
 * Tests that need something a machine may lack (root, systemd, python3, an IPv6 loopback)
 * skip where it is missing, so `npm test` runs on a developer's machine. CI sets
 * AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1: there a skip would pass a run that never tested
 * the thing, so the missing prerequisite is a failure that names it.
 */
export const REQUIRE_ALL_TESTS = process.env.AGENT_CONNECTORS_REQUIRE_ALL_TESTS === '1';

/**
 * The `skip` option for a test that cannot run when `missing` is set (the reason). Under
 * AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1 it also fails `t` (the enclosing test) with that reason.
 */
export function unlessMissing(t: { fail(message: string): unknown }, missing: string | undefined | false): string | false {
  if (!missing) return false;
  if (REQUIRE_ALL_TESTS) t.fail(`AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1 but this test cannot run here: ${missing}`);
  return missing;
}

/**
 * The gate of a contract test that runs as root with tools it names (`missing`: those not
 * found; `packages`: the Debian packages that bring them): `main` runs, or the file plans
 * nothing, or under AGENT_CONNECTORS_REQUIRE_ALL_TESTS=1 fails with the reason.
 */
export async function whenRootWithTools(t: { fail(message: string): unknown; plan(n: number, why: string): unknown }, missing: readonly string[], packages: string, main: () => Promise<void>): Promise<void> {
  if (process.getuid?.() === 0 && missing.length === 0) return main();
  const why = missing.length > 0 ? `needs ${missing.join(' and ')} (Debian packages ${packages})` : 'needs root: creates an agent user and switches to it with setpriv';
  if (REQUIRE_ALL_TESTS) unlessMissing(t, why);
  else t.plan(0, why);
}
