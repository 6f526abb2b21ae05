import type { RenewAuthority } from '../../src/dev/demo-gateway/authority.js';
import type { TapTest } from '../../test/support/tap.js';
import type { TokenVerdict } from './mcp-upstream.js';

/**
 * What the systemd lab files share: a lab run is one long story told in steps, against a
 * mock renewal Gateway whose tokens the MCP upstream honours.
 */

/**
 * The token check of the Gateway's MCP endpoint (an `McpUpstream`): every bearer token goes
 * to the mock renewal Gateway's own authority, as at a real Gateway (401 for anything it did
 * not mint, or minted but expired).
 */
export function checkWith(authority: RenewAuthority): (token: string | undefined) => TokenVerdict {
  return (token) => {
    if (!token) return { ok: false, problem: 'no bearer token' };
    const valid = authority.isValidToken(token);
    return valid ? { ok: true, tokenId: valid.tokenId } : { ok: false, problem: 'a token the Gateway did not mint or that expired' };
  };
}

/** Every token `authority` mints from now on, to search the logs for. */
export function recordMinted(authority: RenewAuthority): string[] {
  const minted: string[] = [];
  const renew = authority.renew.bind(authority);
  authority.renew = (slot, bearer, body) => {
    const result = renew(slot, bearer, body);
    if (result.status === 200 && 'token' in result.body) minted.push(result.body.token);
    return result;
  };
  return minted;
}

/**
 * Subtests of `t` run as steps of one story: once an essential step fails, the rest are
 * skipped (they would only fail after it). A step that throws fails with the error.
 */
export function labSteps(t: TapTest): (name: string, fn: (tt: TapTest) => Promise<void>, essential?: boolean) => Promise<void> {
  let broken: string | undefined;
  return async (name, fn, essential = true) => {
    if (broken) {
      await t.test(name, { skip: `an earlier step failed: ${broken}` }, async () => undefined);
      return;
    }
    await t.test(name, async (tt) => {
      try {
        await fn(tt);
      } catch (err) {
        tt.fail(err instanceof Error ? err.message : String(err));
      } finally {
        if (essential && !tt.passing()) broken = name;
      }
    });
  };
}
