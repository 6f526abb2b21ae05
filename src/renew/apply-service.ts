import { mkdir } from 'node:fs/promises';
import { basename } from 'node:path';
import { watch } from 'chokidar';
import type { Logger } from '../log/logger.js';
import { runLoop } from '../service/loop.js';
import type { Notifier } from '../service/sd-notify.js';
import type { Service } from '../service/service.js';
import { applyInbox, type ApplyDeps } from './apply.js';

export interface ApplyConfig {
  watch: boolean;
  /** In watch mode, a full scan at least this often in case a file event was missed. */
  rescanMs: number;
}

/**
 * renew apply: hand-off → token file. One-shot for a systemd `.path` trigger, or
 * `--watch` (chokidar on inbox/) for hosts without systemd and for `dev`.
 */
export function createApplyService(deps: { config: ApplyConfig; apply: ApplyDeps; log: Logger; notifier: Notifier }): Service {
  const { config, log } = deps;
  return {
    name: 'renew-apply',
    async run(signal) {
      await mkdir(deps.apply.paths.inbox, { recursive: true });
      const once = async (): Promise<void> => {
        const stats = await applyInbox(deps.apply);
        if (stats.applied + stats.ignored + stats.rejected > 0) log.info(stats, 'inbox processed');
      };
      if (!config.watch) {
        await once();
        return;
      }
      // fetch's temp files are 0600 until renamed: ignore them, and never die of a watch error.
      const watcher = watch(deps.apply.paths.inbox, { ignoreInitial: true, depth: 0, ignored: (p: string) => basename(p).startsWith('.') });
      watcher.on('error', (err) => log.warn({ err: { message: (err as Error).message } }, 'watching inbox/ failed; falling back to periodic scans'));
      await new Promise<void>((r) => watcher.once('ready', () => r()));
      await deps.notifier.ready('watching inbox');
      try {
        await runLoop({
          name: 'renew-apply',
          log,
          signal,
          step: async () => {
            await once();
            return config.rescanMs;
          },
          subscribeWake: (wake) => {
            watcher.on('add', wake).on('change', wake).on('raw', wake);
            return () => undefined;
          },
        });
      } finally {
        await watcher.close();
      }
    },
  };
}
