import type { EventEmitter } from 'node:events';
import type { Logger } from '../log/logger.js';
import { ServiceFailedError } from '../errors.js';
import type { Notifier } from './sd-notify.js';

/** What the runner gives each service: everything a long-running part needs from outside. */
export interface ServiceContext {
  /** Aborted when the process is told to stop, or when another service failed. */
  readonly signal: AbortSignal;
  /** This service's logger (bound to `part: <name>`). */
  readonly log: Logger;
  readonly notifier: Notifier;
  /** Calls `fn` on every reload request (SIGHUP); returns the unsubscribe. */
  onReload(fn: () => void): () => void;
}

/**
 * The one shape of every long-running part (tbot's `Service { String(); Run(ctx) }`). `run`
 * resolves once the part has stopped cleanly after `ctx.signal` aborted (a one-shot part may
 * resolve earlier, its work done), and rejects on a failure it cannot recover from. It must
 * release everything it started on either path: the runner's failure path relies on it.
 */
export interface Service {
  readonly name: string;
  run(ctx: ServiceContext): Promise<void>;
}

export interface RunOptions {
  log: Logger;
  notifier: Notifier;
  /** Where SIGTERM/SIGINT/SIGHUP come from (tests pass an emitter). Default: the process. */
  signals?: EventEmitter;
  /**
   * After a failure, how long the other services may take to stop before the process is
   * forced out (`false`: never; in-process tests). A failure must end the process: systemd
   * would otherwise leave a unit that serves nothing "activating" or "active" for good.
   */
  forceExitAfterMs?: number | false;
}

const DEFAULT_FORCE_EXIT_MS = 15_000;

/**
 * Runs services until SIGTERM/SIGINT, owning their lifecycle: each gets its context, the
 * one SIGHUP handler fans reloads out to them, STOPPING=1 goes out once. The first failure
 * stops the others and rejects with a ServiceFailedError naming the service and its cause.
 */
export async function runServices(services: readonly Service[], options: RunOptions): Promise<void> {
  const { log, notifier } = options;
  const signals: EventEmitter = options.signals ?? process;
  const controller = new AbortController();
  const reloads = new Set<() => void>();
  let failure: ServiceFailedError | undefined;

  const stop = (sig: NodeJS.Signals): void => {
    // Once: a second SIGTERM/Ctrl-C gets the default action, killing a stop that hangs.
    signals.off('SIGTERM', stop);
    signals.off('SIGINT', stop);
    if (controller.signal.aborted) return;
    log.info({ signal: sig }, 'stopping');
    controller.abort();
  };
  const reload = (): void => {
    if (reloads.size === 0) log.info('SIGHUP: nothing to reload');
    for (const fn of [...reloads]) fn();
  };
  signals.on('SIGTERM', stop);
  signals.on('SIGINT', stop);
  // Always handled: SIGHUP's default action would kill a part that has nothing to reload.
  signals.on('SIGHUP', reload);
  controller.signal.addEventListener('abort', () => void notifier.stopping(), { once: true });

  try {
    await Promise.all(
      services.map(async (svc) => {
        const ctx: ServiceContext = {
          signal: controller.signal,
          log: log.child({ part: svc.name }),
          notifier,
          onReload(fn) {
            reloads.add(fn);
            return () => reloads.delete(fn);
          },
        };
        try {
          await svc.run(ctx);
        } catch (err) {
          if (failure) {
            log.error({ service: svc.name, err: { message: (err as Error).message } }, 'service failed while stopping');
            return;
          }
          failure = new ServiceFailedError(svc.name, err);
          log.error({ service: svc.name, err: { message: (err as Error).message } }, 'service failed');
          controller.abort();
          armForceExit(failure, options.forceExitAfterMs ?? DEFAULT_FORCE_EXIT_MS);
        }
      }),
    );
  } finally {
    signals.off('SIGTERM', stop);
    signals.off('SIGINT', stop);
    signals.off('SIGHUP', reload);
  }
  // The services released what they started, but a handle anyone forgot would keep the
  // process alive serving nothing: after a failure the last resort stays armed until exit.
  if (failure) throw failure;
}

/** The last resort: exit 1 with the cause on stderr if the process outlives a failure. */
function armForceExit(failure: ServiceFailedError, afterMs: number | false): void {
  if (afterMs === false) return;
  const timer = setTimeout(() => {
    process.stderr.write(`agent-connectors: ${failure.message} (the process did not end after the failure; exiting)\n`);
    process.exit(1);
  }, afterMs);
  // Unref'd: it fires only if something else keeps the process alive.
  timer.unref();
}
