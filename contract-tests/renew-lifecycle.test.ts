import { spawn } from 'node:child_process';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { CLI, CliProc, allProcs, checkNoLeaks, startCli } from '../test/support/cli-proc.js';
import { within } from '../test/support/poll.js';
import { tempDir } from '../test/support/temp-dir.js';
import { makeRig } from './helpers/renew-harness.js';

/*
 * The renewal pair's lifecycle, black-box against the built CLI: both one-shot modes stop
 * on SIGTERM while they wait (fetch between retries, apply for another apply's lock), and
 * a directory fetch or apply must write that it cannot write fails the process at start
 * with a message naming it, before any renewal is attempted.
 */

const isRoot = process.getuid?.() === 0;

/**
 * Starts the CLI unable to write where the modes say it may not. Root writes anywhere
 * through CAP_DAC_OVERRIDE, so as root the CLI runs with that capability (and
 * CAP_DAC_READ_SEARCH) dropped from its bounding set: still uid 0, so it can read this
 * checkout even when the checkout sits in a directory no other user can enter, but a
 * root-owned 0555 directory is now really unwritable.
 */
function startUnprivileged(args: string[]): CliProc {
  const node = [process.execPath, CLI, ...args];
  // `env -u NODE_OPTIONS`: tap's loaders are not the product's.
  const argv = isRoot ? ['env', '-u', 'NODE_OPTIONS', 'setpriv', '--bounding-set=-dac_override,-dac_read_search', '--', ...node] : node;
  const child = spawn(argv[0] as string, argv.slice(1), {
    env: { ...process.env, NOTIFY_SOCKET: '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const proc = new CliProc(child);
  allProcs.push(proc);
  return proc;
}

/** A directory we can enter but not write (without DAC override). */
function readOnlyDir(prefix: string): string {
  const d = tempDir(prefix);
  chmodSync(d, 0o555);
  return d;
}

t.test('renew fetch --once stops on SIGTERM while waiting to retry, keeping its requestId', async (t) => {
  const rig = await makeRig(t);
  const slot = 'instance:term-wait';
  rig.addSlot(slot);
  // A long Retry-After: the old bare setTimeout would have slept through a SIGTERM.
  rig.gw.inject({ kind: 'status429', retryAfterS: 120 }, { slot, times: 1_000 });
  const proc = rig.startFetch(['--once', '--once-budget-ms', '600000']);
  const failed = await proc.waitForLog((l) => l.msg === 'renewal failed; will retry with the same requestId');
  t.equal(failed.retryInMs, 120_000, 'waiting out the Retry-After');
  proc.child.kill('SIGTERM');
  const exit = await within(proc.exited, 10_000, 'fetch --once to stop on SIGTERM');
  t.equal(exit.code, 0, 'a stop is not a failure: exit 0');
  t.ok(proc.logs.some((l) => l.msg === 'stopped before every renewal settled; the next run continues them'), 'says the renewal was left for the next run');
  t.equal(rig.gw.requestsFor(slot).length, 1, 'no retry was sent after the SIGTERM');
  t.equal(rig.readPrivate(slot)?.pending?.requestId, rig.gw.requestsFor(slot)[0]?.requestId, 'the pending requestId stays for the next run');
});

t.test('renew apply stops on SIGTERM while waiting for another apply\'s lock', async (t) => {
  const rig = await makeRig(t);
  // Another apply holds the lock: a live pid (ours), so it is not broken as stale.
  writeFileSync(join(rig.handoff, 'apply.lock'), String(process.pid));
  const proc = startCli(['renew', 'apply', '--handoff', rig.handoff, '--state-dir', rig.applyState, '--log-level', 'trace']);
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  const waiting = await proc.waitForLog((l) => l.msg === 'waiting for another apply to finish');
  t.equal(waiting.owner, process.pid, 'names the holder');
  proc.child.kill('SIGTERM');
  const exit = await within(proc.exited, 10_000, 'apply to stop on SIGTERM');
  t.equal(exit.code, 0, 'exit 0, not the lock timeout\'s failure');
  t.notOk(proc.logs.some((l) => l.level === 'error'), 'no error logged');
});

t.test('fetch fails at start when it cannot write the hand-off inbox', async (t) => {
  const rig = await makeRig(t);
  rig.addSlot('instance:never');
  const handoff = readOnlyDir('ac-renew-ro-handoff-');
  mkdirSync(join(handoff, 'slots'));
  mkdirSync(join(handoff, 'inbox'));
  chmodSync(join(handoff, 'inbox'), 0o555);
  const state = tempDir('ac-renew-ro-state-');
  chmodSync(state, 0o777);
  const proc = startUnprivileged(rig.fetchArgs().map((a) => (a === rig.handoff ? handoff : a === rig.fetchState ? state : a)));
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  const exit = await within(proc.exited, 10_000, 'fetch to fail at start');
  t.equal(exit.code, 1, 'exit 1');
  const stderr = proc.stderr.join('\n');
  t.match(stderr, new RegExp(`link-renewal: cannot write the hand-off inbox in ${join(handoff, 'inbox')}: permission denied`), 'stderr names the directory and why');
  t.equal(rig.gw.requests.length, 0, 'no renewal was attempted');
});

t.test('fetch fails at start when it cannot write its private state', async (t) => {
  const rig = await makeRig(t);
  chmodSync(rig.handoff, 0o777);
  chmodSync(join(rig.handoff, 'inbox'), 0o777);
  const state = readOnlyDir('ac-renew-ro-state-');
  const proc = startUnprivileged(rig.fetchArgs().map((a) => (a === rig.fetchState ? state : a)));
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  const exit = await within(proc.exited, 10_000, 'fetch to fail at start');
  t.equal(exit.code, 1, 'exit 1');
  t.match(proc.stderr.join('\n'), /link-renewal: cannot write the link's private state in .*link\/slots: permission denied/, 'stderr names its private state');
});

t.test('apply fails at start when it cannot write the token files\' directory', async (t) => {
  const rig = await makeRig(t);
  chmodSync(rig.handoff, 0o777);
  for (const sub of ['inbox', 'slots']) chmodSync(join(rig.handoff, sub), 0o777);
  const state = readOnlyDir('ac-renew-ro-apply-');
  const proc = startUnprivileged(['renew', 'apply', '--handoff', rig.handoff, '--state-dir', state]);
  t.teardown(async () => {
    await proc.stop('SIGKILL');
  });
  const exit = await within(proc.exited, 10_000, 'apply to fail at start');
  t.equal(exit.code, 1, 'exit 1');
  t.match(proc.stderr.join('\n'), /apply: cannot write the token files in .*mcp-forwarder: permission denied/, 'stderr names the token directory');
});

checkNoLeaks(t);
