import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { stateLayout } from '../../src/data/state-layout.js';
import { adoptOldPrivateState } from '../../src/link/private-state.js';
import { tempDir } from '../support/temp-dir.js';

function layoutIn(t: { teardown: (fn: () => void) => void }): ReturnType<typeof stateLayout> {
  const root = tempDir('ac-private-state-');
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  return stateLayout(root);
}

function plantSlot(dir: string, requestId: string): void {
  mkdirSync(join(dir, 'slots'), { recursive: true });
  writeFileSync(join(dir, 'slots', 'instance:a.json'), JSON.stringify({ requestId }));
}

t.test("0.1.0's <state>/renew-fetch becomes <state>/link, requestIds and all", async (t) => {
  const layout = layoutIn(t);
  t.equal(layout.linkPrivate, join(layout.root, 'link'));
  plantSlot(join(layout.root, 'renew-fetch'), 'r-old');
  t.equal(await adoptOldPrivateState(layout), join(layout.root, 'renew-fetch'), 'it says what it moved');
  t.same(JSON.parse(readFileSync(join(layout.linkPrivate, 'slots', 'instance:a.json'), 'utf8')), { requestId: 'r-old' });
  t.equal(await adoptOldPrivateState(layout), undefined, 'a second start has nothing to move');
});

t.test('an existing <state>/link is never replaced, even an empty one', async (t) => {
  const layout = layoutIn(t);
  plantSlot(join(layout.root, 'renew-fetch'), 'r-old');
  mkdirSync(layout.linkPrivate);
  t.equal(await adoptOldPrivateState(layout), undefined);
  t.same(JSON.parse(readFileSync(join(layout.root, 'renew-fetch', 'slots', 'instance:a.json'), 'utf8')), { requestId: 'r-old' }, 'the old one is left as it was');
});

t.test('a fresh state root: nothing to do', async (t) => {
  const layout = layoutIn(t);
  t.equal(await adoptOldPrivateState(layout), undefined);
});
