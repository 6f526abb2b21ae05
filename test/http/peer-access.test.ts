import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { PeerAccess, resolveAgentUsers } from '../../src/http/peer-access.js';
import { createLogger } from '../../src/log/logger.js';
import { tempDir } from '../support/temp-dir.js';

const log = createLogger('silent');

t.test('resolveAgentUsers: names through the passwd file, UIDs as given; an unknown name is an error naming it', async (t) => {
  const passwd = join(tempDir('ac-passwd-', t), 'passwd');
  writeFileSync(passwd, 'root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n');
  t.same(resolveAgentUsers([{ name: 'alice' }, { uid: 42 }], passwd), { ok: true, value: [1000, 42] });
  t.same(resolveAgentUsers([{ name: 'mallory' }], passwd), { ok: false, error: 'no such user "mallory"' });
});

t.test('PeerAccess: always-allowed, fixed and file UIDs; a dynamic UID only when NSS names it as the link', async (t) => {
  const dir = tempDir('ac-peer-access-', t);
  const file = join(dir, 'agent-users');
  writeFileSync(file, '1000\n');
  const asked: number[] = [];
  const access = new PeerAccess({
    always: new Set([0, 990]),
    fixed: new Set([1234]),
    file,
    log,
    alwaysDynamic: ['agent-connectors-link'],
    userName: async (uid) => {
      asked.push(uid);
      return uid === 62000 ? 'agent-connectors-link' : uid === 62001 ? 'some-other-unit' : undefined;
    },
  });
  await access.start();
  t.teardown(() => access.close());
  for (const uid of [0, 990, 1234, 1000, 62000]) t.equal(await access.allows(uid), true, `uid ${uid} allowed`);
  for (const uid of [1001, 62001, 65534, 61183, 65520]) t.equal(await access.allows(uid), false, `uid ${uid} refused`);
  t.same(asked, [62000, 62001], 'NSS asked only for refused UIDs in the dynamic range (65534, nobody, is outside it)');
});

t.test('PeerAccess with no file: only the always-allowed', async (t) => {
  const access = new PeerAccess({ always: new Set([0]), file: join(tempDir('ac-peer-access-', t), 'missing'), log });
  await access.start();
  t.teardown(() => access.close());
  t.equal(await access.allows(0), true);
  t.equal(await access.allows(1000), false);
});
