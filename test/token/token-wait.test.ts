import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';
import { TokenRotationWait } from '../../src/token/token-wait.js';

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

t.test('a token already renewed is returned at once, without a watch', async (t) => {
  const { file, rotate } = setup(t);
  rotate('new-token');
  const wait = new TokenRotationWait();
  t.equal(await wait.waitForChange(file, 'old-token', 5_000), 'new-token');
  t.equal(wait.watching, 0);
});

t.test('waiters resolve with the renamed-in token; many waiters share one watch, closed after', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const waits = Array.from({ length: 50 }, () => wait.waitForChange(file, 'old-token', 60_000));
  t.equal(wait.watching, 1, 'one watch for fifty requests on one file');
  rotate('new-token');
  t.same(new Set(await Promise.all(waits)), new Set(['new-token']));
  t.equal(wait.watching, 0, 'the watch is closed once nobody waits');
});

t.test('no rotation: resolves undefined after the bound, and a rewrite with the same token does not count', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const pending = wait.waitForChange(file, 'old-token', 300);
  rotate('old-token');
  t.equal(await pending, undefined);
  t.equal(wait.watching, 0);
});

t.test('a missing or empty file during the rotation keeps waiting; the token that follows is taken', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const pending = wait.waitForChange(file, 'old-token', 60_000);
  rmSync(file);
  writeFileSync(file, '');
  rotate('third-token');
  t.equal(await pending, 'third-token');
});

t.test('the agent leaving ends its wait at once; others keep waiting', async (t) => {
  const { file, rotate } = setup(t);
  const wait = new TokenRotationWait();
  const left = new AbortController();
  const gone = wait.waitForChange(file, 'old-token', 60_000, left.signal);
  const stays = wait.waitForChange(file, 'old-token', 60_000);
  left.abort();
  t.equal(await gone, undefined);
  t.equal(wait.watching, 1, 'still watched for the other request');
  rotate('new-token');
  t.equal(await stays, 'new-token');
});

t.test('a bound of 0 does not wait', async (t) => {
  const { file } = setup(t);
  const wait = new TokenRotationWait();
  t.equal(await wait.waitForChange(file, 'old-token', 0), undefined);
  t.equal(wait.watching, 0);
});

t.test('a token file in a directory that does not exist: the poll still bounds the wait', async (t) => {
  const { dir } = setup(t);
  const wait = new TokenRotationWait();
  t.equal(await wait.waitForChange(join(dir, 'nope', 'x.token'), 'old-token', 250), undefined);
  t.equal(wait.watching, 0);
});
