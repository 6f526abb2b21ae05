import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';
import { TokenRotationWait, type WaitEnd } from '../../src/token/token-wait.js';

function setup(t: TapTest): { dir: string; file: string; rotate: (token: string) => void } {
  const dir = tempDir('token-wait-', t);
  const file = join(dir, 'inst.token');
  writeFileSync(file, 'old-token\n', { mode: 0o600 });
  let n = 0;
  // As apply does it: a new file renamed over the old one.
  const rotate = (token: string): void => {
    const tmp = join(dir, `.inst.token.${n++}.tmp`);
    writeFileSync(tmp, `${token}\n`, { mode: 0o600 });
    renameSync(tmp, file);
  };
  return { dir, file, rotate };
}

const renewed = (token: string): WaitEnd => ({ kind: 'renewed', token });

t.test('a token already renewed is returned at once, without a watch', async (t) => {
  const { file, rotate } = setup(t);
  rotate('new-token');
  const wait = new TokenRotationWait();
  t.same(await wait.waitForChange(file, 'old-token', 5_000), renewed('new-token'));
  t.equal(wait.watching, 0);
});

t.test('waiters resolve with the renamed-in token; many waiters share one watch, closed after', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const waits = Array.from({ length: 50 }, () => wait.waitForChange(file, 'old-token', 60_000));
  t.equal(wait.watching, 1, 'one watch for fifty requests on one file');
  rotate('new-token');
  const ends = await Promise.all(waits);
  t.ok(ends.every((e) => e.kind === 'renewed' && e.token === 'new-token'));
  t.equal(wait.watching, 0, 'the watch is closed once nobody waits');
});

t.test('no rotation: times out after the bound, and a rewrite with the same token does not count', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const pending = wait.waitForChange(file, 'old-token', 300);
  rotate('old-token');
  t.same(await pending, { kind: 'timeout' });
  t.equal(wait.watching, 0);
});

t.test('an empty file during the rotation keeps waiting; the token that follows is taken', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const pending = wait.waitForChange(file, 'old-token', 60_000);
  writeFileSync(file, '');
  rotate('third-token');
  t.same(await pending, renewed('third-token'));
});

t.test('the token file deleted during the wait (a disconnect) ends every wait on it at once', async (t) => {
  const { file } = setup(t);
  const wait = new TokenRotationWait();
  // Ten minutes: only the deletion can end these within the test's time.
  const waits = [wait.waitForChange(file, 'old-token', 600_000), wait.waitForChange(file, 'old-token', 600_000)];
  t.equal(wait.watching, 1, 'both are waiting');
  rmSync(file);
  t.same(await Promise.all(waits), [{ kind: 'deleted' }, { kind: 'deleted' }]);
  t.equal(wait.watching, 0);
});

t.test('the route gone from the config ends that wait only; a file already missing ends it without a watch', async (t) => {
  const { dir, file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  let configured = true;
  const unrouted = wait.waitForChange(file, 'old-token', 600_000, { routed: () => configured });
  const other = wait.waitForChange(file, 'old-token', 600_000, { routed: () => true });
  configured = false;
  t.same(await unrouted, { kind: 'unrouted' });
  t.equal(wait.watching, 1, 'still watched for the other request');
  rotate('new-token');
  t.same(await other, renewed('new-token'));
  t.same(await wait.waitForChange(join(dir, 'nope', 'x.token'), 'old-token', 600_000), { kind: 'deleted' });
  t.equal(wait.watching, 0);
});

t.test('the agent leaving ends its wait at once; others keep waiting', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const left = new AbortController();
  const gone = wait.waitForChange(file, 'old-token', 60_000, { signal: left.signal });
  const stays = wait.waitForChange(file, 'old-token', 60_000);
  left.abort();
  t.same(await gone, { kind: 'left' });
  t.equal(wait.watching, 1, 'still watched for the other request');
  rotate('new-token');
  t.same(await stays, renewed('new-token'));
});

t.test('a bound of 0 does not wait', async (t) => {
  const { file } = setup(t);
  const wait = new TokenRotationWait();
  t.same(await wait.waitForChange(file, 'old-token', 0), { kind: 'timeout' });
  t.equal(wait.watching, 0);
});
