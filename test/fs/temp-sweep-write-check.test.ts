import { spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { checkWritableDir, sweepStaleTemps } from '../../src/fs/atomic-write.js';

function dir(): string {
  const d = mkdtempSync(join(tmpdir(), 'ac-sweep-'));
  t.teardown(() => {
    chmodSync(d, 0o700);
    rmSync(d, { recursive: true, force: true });
  });
  return d;
}

/** A pid that belonged to a process which has exited (reuse within a test is not a concern). */
function deadPid(): number {
  const child = spawnSync(process.execPath, ['-e', '0']);
  if (typeof child.pid !== 'number') throw new Error('could not start a child');
  return child.pid;
}

t.test('sweepStaleTemps removes only temps whose writer is gone', async (t) => {
  const d = dir();
  const dead = deadPid();
  const names = {
    deadToken: `.a.token.${dead}.0123456789ab.tmp`,
    deadInbox: `.instance:x.json.${dead}.abcdefabcdef.tmp`,
    live: `.a.token.${process.ppid}.0123456789ab.tmp`,
    ours: `.a.token.${process.pid}.0123456789ab.tmp`,
    notTemp: 'a.token',
    otherDot: '.hidden.tmp',
  };
  for (const name of Object.values(names)) writeFileSync(join(d, name), 'x');
  const removed = await sweepStaleTemps(d);
  t.strictSame(removed.sort(), [names.deadInbox, names.deadToken].sort(), 'the dead writers\' temps');
  t.strictSame(readdirSync(d).sort(), [names.live, names.ours, names.notTemp, names.otherDot].sort(), 'everything else stays');
});

t.test('sweepStaleTemps with a target sweeps that file\'s temps only', async (t) => {
  const d = dir();
  const dead = deadPid();
  const mine = `.a.token.${dead}.0123456789ab.tmp`;
  const other = `.b.token.${dead}.0123456789ab.tmp`;
  writeFileSync(join(d, mine), 'x');
  writeFileSync(join(d, other), 'x');
  t.strictSame(await sweepStaleTemps(d, { target: 'a.token' }), [mine]);
  t.ok(existsSync(join(d, other)), 'another file\'s temp is left alone');
  t.strictSame(await sweepStaleTemps(join(d, 'missing')), [], 'a missing directory sweeps nothing');
});

t.test('checkWritableDir creates a missing directory and leaves no probe behind', async (t) => {
  const d = dir();
  const target = join(d, 'inbox');
  await checkWritableDir(target, 'the hand-off inbox', { mode: 0o700 });
  t.ok(existsSync(target), 'created');
  t.strictSame(readdirSync(target), [], 'no probe file left');
  await checkWritableDir(join(d, 'quiet'), 'the hand-off inbox', { probe: false });
  t.ok(existsSync(join(d, 'quiet')), 'without a probe: created too');
});

t.test('checkWritableDir names what and where when it cannot write', async (t) => {
  const d = dir();
  const file = join(d, 'a-file');
  writeFileSync(file, 'x');
  await t.rejects(checkWritableDir(join(file, 'inbox'), 'the hand-off inbox'), /cannot write the hand-off inbox in .*a-file\/inbox: not a directory/);

  if (process.getuid?.() === 0) {
    t.comment('running as root: a read-only mode does not stop root; skipped the EACCES case');
    return;
  }
  const ro = join(d, 'ro');
  await checkWritableDir(ro, 'x');
  chmodSync(ro, 0o500);
  await t.rejects(checkWritableDir(ro, "fetch's private state"), /cannot write fetch's private state in .*\/ro: permission denied/);
  await t.rejects(checkWritableDir(ro, 'the hand-off inbox', { probe: false }), /cannot write the hand-off inbox in .*\/ro: permission denied/, 'without a probe too');
});
