import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { localConfigFiles } from '../../src/apply/local-config.js';
import { revokeIfMarked } from '../../src/apply/revoke.js';
import { batchFileName, handoffPaths, slotFileName } from '../../src/data/handoff.js';
import { writeHostRevoked } from '../../src/data/host-revoked.js';
import { stateLayout } from '../../src/data/state-layout.js';
import { memoryLogger } from '../support/memory-log.js';

// A renewal in flight when the host is revoked hands its tokens over in either shape the
// link writes: one file per slot, or a batch (its group commit). Neither may outlive the
// revocation: each holds tokens, and nothing will ever apply them.
t.test('a host revocation empties the inbox of per-slot answers and batches alike, and leaves what the link does not write', async (t) => {
  const root = mkdtempSync(join(tmpdir(), 'ac-revoke-'));
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const l = stateLayout(root);
  const paths = handoffPaths(l.handoff);
  for (const d of [paths.inbox, paths.slots]) mkdirSync(d, { recursive: true });
  const handedOver = [slotFileName('instance:i1'), batchFileName(1796296006988000, 'd7ae0ffe5492')];
  for (const name of handedOver) writeFileSync(join(paths.inbox, name), '{"token":"minted-but-never-applied"}\n');
  // Not the link's: an operator's note.
  const others = ['README'];
  for (const name of others) writeFileSync(join(paths.inbox, name), 'x');
  t.ok(await writeHostRevoked(l.handoff, 'gateway'));
  const { log } = memoryLogger();
  const outcome = await revokeIfMarked({ paths, layout: l, local: localConfigFiles(l), log, tokenDirs: [] });
  t.match(outcome, { kind: 'revoked' });
  for (const name of handedOver) t.notOk(existsSync(join(paths.inbox, name)), `${name} deleted`);
  t.same(readdirSync(paths.inbox), others, 'only what the link does not write is left');
});
