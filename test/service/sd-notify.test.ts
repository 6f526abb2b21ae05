import { setTimeout as sleep } from 'node:timers/promises';
import t from 'tap';
import { createNotifier } from '../../src/service/sd-notify.js';
import { memoryLogger } from '../support/memory-log.js';
import { notifyReceiverMissing, startNotifyReceiver, type NotifyReceiver, systemdNotifyMissing, type NotifyDatagram } from '../tools/notify-receiver.js';
import { unlessMissing } from '../tools/prerequisite.js';

const needsReceiver = { skip: unlessMissing(t, notifyReceiverMissing() ?? systemdNotifyMissing()) };

/** The assignments of a datagram, minus MAINPID= (added by systemd-notify --pid). */
function assignments(dg: NotifyDatagram): string[] {
  return dg.assignments.filter((l) => !l.startsWith('MAINPID='));
}

/** Waits until `n` datagrams have arrived. */
function received(rx: NotifyReceiver, n: number): Promise<number> {
  return rx.waitFor(() => true, n - 1, `datagram #${n}`);
}

t.test('without NOTIFY_SOCKET every call is a no-op', async (t) => {
  const { log, records } = memoryLogger();
  // A binary that does not exist would log a warning if anything were sent.
  for (const env of [{}, { NOTIFY_SOCKET: '' }]) {
    const n = createNotifier({ env, log, binary: '/nonexistent/systemd-notify' });
    t.equal(n.enabled, false);
    await t.resolves(n.ready('serving 3 instances'));
    await t.resolves(n.status('x'));
    await t.resolves(n.reloading());
    await t.resolves(n.stopping());
    const stop = n.startWatchdog();
    t.type(stop, 'function');
    stop();
  }
  t.strictSame(records, [], 'nothing attempted, nothing logged');
});

t.test('with a real NOTIFY_SOCKET: READY+STATUS, RELOADING+MONOTONIC_USEC, STOPPING arrive in order', needsReceiver, async (t) => {
  const rx = await startNotifyReceiver(t);
  const { log, records } = memoryLogger();
  const n = createNotifier({ env: { NOTIFY_SOCKET: rx.socketPath }, log });
  t.equal(n.enabled, true);
  await n.ready('serving 2 instances');
  await n.reloading();
  await n.ready('serving 3 instances');
  await n.status('still serving 3 instances');
  await n.stopping();
  await received(rx, 5);
  const got = rx.datagrams.map(assignments);
  t.strictSame(got[0], ['READY=1', 'STATUS=serving 2 instances']);
  t.equal(got[1]?.[0], 'RELOADING=1');
  t.match(got[1]?.[1] ?? '', /^MONOTONIC_USEC=\d+$/);
  t.equal(got[1]?.length, 2);
  t.strictSame(got[2], ['READY=1', 'STATUS=serving 3 instances']);
  t.strictSame(got[3], ['STATUS=still serving 3 instances']);
  t.strictSame(got[4], ['STOPPING=1']);
  t.equal(rx.datagrams.length, 5, 'nothing else was sent');
  // MONOTONIC_USEC is CLOCK_MONOTONIC in µs; it must be close to our own monotonic clock.
  const usec = Number((got[1]?.[1] ?? '').split('=')[1]);
  const nowUsec = Number(process.hrtime.bigint() / 1000n);
  t.ok(usec > 0 && usec <= nowUsec && nowUsec - usec < 60_000_000, 'MONOTONIC_USEC is a recent CLOCK_MONOTONIC time');
  t.strictSame(records.filter((r) => r.level >= 40), [], 'no warnings');
});

t.test('a status containing newlines is sent as one line: no injected assignment', needsReceiver, async (t) => {
  const rx = await startNotifyReceiver(t);
  const n = createNotifier({ env: { NOTIFY_SOCKET: rx.socketPath } });
  await n.ready('line one\nERRNO=5\r\nSTOPPING=1');
  await n.status('a\rWATCHDOG=trigger');
  await received(rx, 2);
  const [first, second] = rx.datagrams.map(assignments);
  t.equal(first?.length, 2, `READY and one STATUS line only: ${JSON.stringify(first)}`);
  t.equal(first?.[0], 'READY=1');
  t.match(first?.[1] ?? '', /^STATUS=line one.*ERRNO=5.*STOPPING=1$/);
  t.notOk(first?.includes('ERRNO=5'), 'no ERRNO= assignment');
  t.notOk(first?.includes('STOPPING=1'), 'no STOPPING= assignment');
  t.equal(second?.length, 1);
  t.match(second?.[0] ?? '', /^STATUS=a.*WATCHDOG=trigger$/);
  for (const dg of rx.datagrams) t.notMatch(dg.raw, /\r/, 'no CR survives');
});

t.test('watchdog pings at half of WATCHDOG_USEC and stops when told', needsReceiver, async (t) => {
  const rx = await startNotifyReceiver(t);
  const n = createNotifier({ env: { NOTIFY_SOCKET: rx.socketPath, WATCHDOG_USEC: '400000', WATCHDOG_PID: String(process.pid) } });
  const stop = n.startWatchdog();
  await received(rx, 3);
  stop();
  for (const dg of rx.datagrams) t.strictSame(assignments(dg), ['WATCHDOG=1']);
});

t.test('watchdog is off when WATCHDOG_PID names another process or WATCHDOG_USEC is unset', async (t) => {
  const { log, records } = memoryLogger();
  for (const env of [
    { NOTIFY_SOCKET: '/nonexistent.sock', WATCHDOG_USEC: '400000', WATCHDOG_PID: '1' },
    { NOTIFY_SOCKET: '/nonexistent.sock' },
    { NOTIFY_SOCKET: '/nonexistent.sock', WATCHDOG_USEC: 'garbage' },
  ]) {
    const stop = createNotifier({ env, log, binary: '/nonexistent/systemd-notify' }).startWatchdog();
    stop();
  }
  // Had any ping been attempted, the missing binary would have logged a warning.
  await sleep(50);
  t.strictSame(records, []);
});

t.test('a missing systemd-notify binary logs a warning and does not throw', async (t) => {
  const { log, records } = memoryLogger();
  const n = createNotifier({ env: { NOTIFY_SOCKET: '/run/does-not-matter.sock' }, log, binary: '/nonexistent' });
  t.equal(n.enabled, true);
  await t.resolves(n.ready('x'));
  await t.resolves(n.reloading());
  await t.resolves(n.stopping());
  const warnings = records.filter((r) => r.level === 40);
  t.equal(warnings.length, 3, 'one warning per failed message');
  t.match(warnings[0]?.msg, /sd_notify/);
});

t.test('a missing binary without a logger does not throw either', async (t) => {
  const n = createNotifier({ env: { NOTIFY_SOCKET: '/run/x.sock' }, binary: '/nonexistent' });
  await t.resolves(n.ready('x'));
});
