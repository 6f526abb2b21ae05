import type { RenewAuthority } from '../../src/dev/demo-gateway/authority.js';
import type { TapTest } from '../../test/support/tap.js';
import type { McpSeen, TokenVerdict } from './mcp-upstream.js';

/**
 * What the systemd lab files share: a lab run is one long story told in steps, against a
 * mock renewal Gateway whose tokens the MCP upstream honours.
 */

/** A token the Gateway minted and refuses now: superseded by a renewal (strict: a slot honours only its newest) or expired. */
export const SUPERSEDED = 'a token the Gateway minted and has since superseded or let expire';

/**
 * The token check of the Gateway's MCP endpoint (an `McpUpstream`): every bearer token goes
 * to the mock renewal Gateway's own authority, as at a real Gateway (401 for anything it did
 * not mint, or minted but superseded or expired). `minted` (recordMinted's list) tells a
 * token the Gateway once minted from one it never did.
 */
export function checkWith(authority: RenewAuthority, minted: readonly string[]): (token: string | undefined) => TokenVerdict {
  return (token) => {
    if (!token) return { ok: false, problem: 'no bearer token' };
    const valid = authority.isValidToken(token);
    if (valid) return { ok: true, tokenId: valid.tokenId };
    return { ok: false, problem: minted.includes(token) ? SUPERSEDED : 'a token the Gateway did not mint' };
  };
}

/**
 * What the upstream refused that the forwarder did not bridge: every refusal but a
 * superseded token, and a superseded token only when no request of the same method,
 * JSON-RPC method and session with a valid token followed it. A request that reads the token file just before
 * apply writes a renewal carries the token the Gateway has just superseded (the renewal
 * raced it, more often on a busy machine); the forwarder's 401 bridge retries it with the
 * renewed token (SPEC §4), which is the request that follows.
 */
export function unbridged(seen: readonly McpSeen[]): string[] {
  return seen.flatMap((s, i) => {
    if (s.valid) return [];
    if (s.problem !== SUPERSEDED) return [s.problem ?? 'refused'];
    const retried = seen.slice(i + 1).some((r) => r.valid && r.method === s.method && r.rpcMethod === s.rpcMethod && r.sessionId === s.sessionId);
    return retried ? [] : [`${SUPERSEDED}, and no retry with a valid token followed`];
  });
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
