import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setImmediate as tick } from 'node:timers/promises';
import t from 'tap';
import { withFileLock } from '../../src/fs/file-lock.js';
import { tempDir } from '../support/temp-dir.js';

const dir = (): string => tempDir('ac-lock-', t);

/** A pid that surely belonged to a process that has exited. */
async function deadPid(): Promise<number> {
  const child = spawn('true', [], { stdio: 'ignore' });
  const pid = child.pid;
  await once(child, 'exit');
  if (pid === undefined) throw new Error('spawn failed');
  return pid;
}

t.test('mutual exclusion: parallel callers never overlap', async (t) => {
  const d = dir();
  const f = join(d, 'instances.json');
  let inside = 0;
  let maxInside = 0;
  const order: number[] = [];
  const callers = Array.from({ length: 12 }, (_, i) =>
    withFileLock(
      f,
      async () => {
        inside++;
        maxInside = Math.max(maxInside, inside);
        t.ok(existsSync(`${f}.lock`), 'the lock file exists while held');
        // Yield several times inside the critical section so others get every chance to enter.
        for (let k = 0; k < 5; k++) await tick();
        order.push(i);
        inside--;
        return i;
      },
      { timeoutMs: 30_000, retryMs: 2 },
    ),
  );
  const results = await Promise.all(callers);
  t.strictSame(results, Array.from({ length: 12 }, (_, i) => i), 'each caller gets its own result');
  t.equal(maxInside, 1, 'never two holders at once');
  t.equal(order.length, 12, 'every caller ran');
  t.notOk(existsSync(`${f}.lock`), 'lock file removed afterwards');
});

t.test('read-modify-write under the lock loses no update', async (t) => {
  const d = dir();
  const f = join(d, 'counter');
  writeFileSync(f, '0');
  await Promise.all(
    Array.from({ length: 20 }, () =>
      withFileLock(
        f,
        async () => {
          const n = Number(readFileSync(f, 'utf8'));
          await tick();
          writeFileSync(f, String(n + 1));
        },
        { timeoutMs: 30_000, retryMs: 2 },
      ),
    ),
  );
  t.equal(readFileSync(f, 'utf8'), '20');
});

t.test('the lock file is removed after fn throws, and the error propagates', async (t) => {
  const d = dir();
  const f = join(d, 'x.json');
  await t.rejects(
    withFileLock(f, async () => {
      throw new Error('boom');
    }),
    { message: 'boom' },
  );
  t.notOk(existsSync(`${f}.lock`));
  t.equal(await withFileLock(f, async () => 'again'), 'again', 'the lock can be taken again');
});

t.test('a stale lock holding a dead pid is broken', async (t) => {
  const d = dir();
  const f = join(d, 'instances.json');
  const pid = await deadPid();
  writeFileSync(`${f}.lock`, String(pid));
  let ran = false;
  await withFileLock(
    f,
    async () => {
      ran = true;
      t.equal(readFileSync(`${f}.lock`, 'utf8').trim(), String(process.pid), 'the lock now names us');
    },
    { timeoutMs: 5_000 },
  );
  t.ok(ran, 'fn ran despite the stale lock');
  t.notOk(existsSync(`${f}.lock`), 'lock file removed afterwards');
});

t.test('a lock held by a live pid times out and is left alone', async (t) => {
  const d = dir();
  const f = join(d, 'instances.json');
  const holder = spawn('sleep', ['30'], { stdio: 'ignore' });
  const holderExit = once(holder, 'exit');
  t.teardown(async () => {
    if (holder.exitCode === null && holder.signalCode === null) holder.kill('SIGKILL');
    await holderExit;
  });
  const pid = holder.pid;
  t.type(pid, 'number');
  writeFileSync(`${f}.lock`, `${pid}\n`);
  let ran = false;
  await t.rejects(
    withFileLock(
      f,
      async () => {
        ran = true;
      },
      { timeoutMs: 300, retryMs: 10 },
    ),
    /lock/,
  );
  t.notOk(ran, 'fn never ran');
  t.equal(readFileSync(`${f}.lock`, 'utf8').trim(), String(pid), 'the live holder keeps its lock');

  // Once the holder dies, the same lock is broken and taken.
  holder.kill('SIGKILL');
  await holderExit;
  t.equal(await withFileLock(f, async () => 'after', { timeoutMs: 5_000 }), 'after');
  t.notOk(existsSync(`${f}.lock`));
});
