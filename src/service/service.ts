import type { Logger } from '../log/logger.js';

/**
 * The one shape of every long-running part. `run` resolves once the part has stopped
 * cleanly after `signal` aborted, and rejects on a failure it cannot recover from.
 */
export interface Service {
  readonly name: string;
  run(signal: AbortSignal): Promise<void>;
}

/**
 * Runs services until SIGTERM/SIGINT (or until one fails, which stops the others).
 * Returns the process exit code.
 */
export async function runServices(services: readonly Service[], log: Logger): Promise<number> {
  const controller = new AbortController();
  const stop = (sig: NodeJS.Signals): void => {
    log.info({ signal: sig }, 'stopping');
    controller.abort();
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  let failed = false;
  await Promise.all(
    services.map(async (svc) => {
      try {
        await svc.run(controller.signal);
      } catch (err) {
        failed = true;
        log.error({ service: svc.name, err: { message: (err as Error).message } }, 'service failed');
        controller.abort();
      }
    }),
  );
  process.off('SIGTERM', stop);
  process.off('SIGINT', stop);
  return failed ? 1 : 0;
}
