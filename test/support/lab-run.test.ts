import { randomUUID } from 'node:crypto';
import t from 'tap';
import { RenewAuthority } from '../../src/dev/demo-gateway/authority.js';
import { SUPERSEDED, checkWith, recordMinted, unbridged } from '../../contract-tests/helpers/lab-run.js';
import type { McpSeen } from '../../contract-tests/helpers/mcp-upstream.js';

/**
 * The labs' token check (contract-tests/helpers/lab-run.ts) must tell a renewal that raced a
 * request, which the forwarder bridges, from a token the Gateway never minted or a refusal
 * nobody retried: the lab steps trust it to fail on the second and not on the first.
 */

const seen = (method: string, valid: boolean, problem?: string, sessionId = 's1', rpcMethod = 'tools/call'): McpSeen => ({ method, token: 'tok', valid, sessionId, rpcMethod, ...(problem ? { problem } : {}) });

t.test('checkWith: a superseded token is told from one the Gateway never minted', async (t) => {
  const credential = 'hostcred-lab-run-test';
  const authority = new RenewAuthority({ credential, tokenLifetimeMs: 60_000, slots: ['instance:a'] });
  const minted = recordMinted(authority);
  const check = checkWith(authority, minted);
  const first = authority.renew('instance:a', credential, { requestId: randomUUID(), expectedTokenId: null });
  const firstToken = 'token' in first.body ? first.body.token : '';
  const firstId = 'tokenId' in first.body ? first.body.tokenId : null;
  t.ok(firstToken, 'a token minted');
  t.match(check(firstToken), { ok: true }, 'the current token passes');
  t.equal(authority.renew('instance:a', credential, { requestId: randomUUID(), expectedTokenId: firstId }).status, 200, 'renewed');
  t.same(check(firstToken), { ok: false, problem: SUPERSEDED }, 'the one a renewal replaced is superseded');
  t.same(check('made-up-token'), { ok: false, problem: 'a token the Gateway did not mint' }, 'a token it never minted says so');
  t.same(check(undefined), { ok: false, problem: 'no bearer token' });
});

t.test('unbridged: only a refusal the forwarder did not retry with a valid token is reported', async (t) => {
  t.same(unbridged([seen('POST', true), seen('POST', false, SUPERSEDED), seen('POST', true)]), [], 'superseded, then the retry: bridged');
  t.same(unbridged([seen('POST', true), seen('POST', false, SUPERSEDED)]), [`${SUPERSEDED}, and no retry with a valid token followed`], 'superseded with nothing after it');
  t.same(
    unbridged([seen('POST', false, SUPERSEDED), seen('GET', true), seen('POST', true, undefined, 's2'), seen('POST', true, undefined, 's1', 'tools/list')]),
    [`${SUPERSEDED}, and no retry with a valid token followed`],
    'a valid request of another method, session or JSON-RPC method is not its retry',
  );
  t.same(unbridged([seen('POST', false, 'a token the Gateway did not mint'), seen('POST', true)]), ['a token the Gateway did not mint'], 'any other refusal is reported, retried or not');
});
