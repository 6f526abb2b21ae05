import { EventEmitter } from 'node:events';
import t from 'tap';
import { createNotifier } from '../../src/service/sd-notify.js';
import { ServiceFailedError } from '../../src/errors.js';
import { runServices, type Service, type ServiceContext } from '../../src/service/service.js';
import { memoryLogger } from '../support/memory-log.js';

const quiet = createNotifier({ env: {} });

/** A service that records its context and stops when told to. */
function waiting(name: string, seen: Map<string, ServiceContext>, stopped: string[]): Service {
  return {
    name,
    async run(ctx) {
      seen.set(name, ctx);
      await new Promise<void>((r) => (ctx.signal.aborted ? r() : ctx.signal.addEventListener('abort', () => r(), { once: true })));
      stopped.push(name);
    },
  };
}

/** Resolves once every named service has started (their run was called). */
async function started(seen: Map<string, ServiceContext>, names: string[]): Promise<void> {
  while (!names.every((n) => seen.has(n))) await new Promise<void>((r) => setImmediate(r));
}

t.test('SIGTERM stops every service; each got its own logger and the shared notifier', async (t) => {
  const { log, records } = memoryLogger();
  const signals = new EventEmitter();
  const seen = new Map<string, ServiceContext>();
  const stopped: string[] = [];
  const run = runServices([waiting('a', seen, stopped), waiting('b', seen, stopped)], { log, notifier: quiet, signals, forceExitAfterMs: false });
  await started(seen, ['a', 'b']);
  seen.get('a')?.log.info('hello from a');
  t.equal(seen.get('b')?.notifier, quiet);
  signals.emit('SIGTERM', 'SIGTERM');
  t.equal(signals.listenerCount('SIGTERM') + signals.listenerCount('SIGINT'), 0, 'a second SIGTERM/Ctrl-C is left to its default action (kills a hung stop)');
  await run;
  t.strictSame(stopped.sort(), ['a', 'b']);
  t.equal(records.find((r) => r.msg === 'hello from a')?.part, 'a', 'the logger is bound to the service');
  t.equal(signals.listenerCount('SIGTERM') + signals.listenerCount('SIGINT') + signals.listenerCount('SIGHUP'), 0, 'handlers removed');
});

t.test('one SIGHUP handler fans out to every subscriber until it unsubscribes', async (t) => {
  const { log, records } = memoryLogger();
  const signals = new EventEmitter();
  const seen = new Map<string, ServiceContext>();
  const run = runServices([waiting('a', seen, []), waiting('b', seen, [])], { log, notifier: quiet, signals, forceExitAfterMs: false });
  await started(seen, ['a', 'b']);
  t.equal(signals.listenerCount('SIGHUP'), 1, 'one handler for the process');
  const calls: string[] = [];
  const offA = seen.get('a')?.onReload(() => calls.push('a'));
  seen.get('b')?.onReload(() => calls.push('b'));
  signals.emit('SIGHUP', 'SIGHUP');
  offA?.();
  signals.emit('SIGHUP', 'SIGHUP');
  t.strictSame(calls, ['a', 'b', 'b']);
  t.notOk(records.some((r) => r.msg === 'SIGHUP: nothing to reload'));
  signals.emit('SIGINT', 'SIGINT');
  await run;
});

t.test('a failing service stops the others and rejects with its name and cause', async (t) => {
  const { log, records } = memoryLogger();
  const signals = new EventEmitter();
  const seen = new Map<string, ServiceContext>();
  const stopped: string[] = [];
  const failing: Service = {
    name: 'broken',
    async run() {
      await started(seen, ['a']);
      throw new Error('listen EADDRINUSE');
    },
  };
  const err = await runServices([waiting('a', seen, stopped), failing], { log, notifier: quiet, signals, forceExitAfterMs: false }).then(
    () => undefined,
    (e: unknown) => e,
  );
  t.ok(err instanceof ServiceFailedError, 'a ServiceFailedError');
  t.equal((err as ServiceFailedError).message, 'broken: listen EADDRINUSE');
  t.equal((err as ServiceFailedError).service, 'broken');
  t.strictSame(stopped, ['a'], 'the other service was stopped');
  t.ok(seen.get('a')?.signal.aborted, 'through its signal');
  t.ok(records.some((r) => r.msg === 'service failed' && r.service === 'broken'), 'logged');
});

t.test('a one-shot service that finishes ends the run cleanly', async (t) => {
  const { log } = memoryLogger();
  const signals = new EventEmitter();
  let ran = 0;
  await runServices([{ name: 'once', run: async () => void (ran += 1) }], { log, notifier: quiet, signals, forceExitAfterMs: false });
  t.equal(ran, 1);
});
