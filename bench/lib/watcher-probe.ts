/**
 * The watched side of `npm run bench -- --watcher`, one process per run so its CPU and RSS
 * are the watcher's alone: `node watcher-probe.js chokidar|fs.watch DIR REGISTRY_NAME`,
 * forked with an IPC channel. It watches DIR the way the program did (chokidar configured
 * as hot-file configured it, listeners included) or does (`watchDir`), and answers the
 * harness: `ready` once watching, the first event for the registry after each `arm`, and
 * `usage` (CPU, RSS, token events seen) on request. Times are `process.hrtime` (the
 * monotonic clock, the same in both processes).
 */
import { basename } from 'node:path';
import { watchDir } from '../../src/fs/dir-watch.js';

export type ProbeKind = 'chokidar' | 'fs.watch';

export type ProbeRequest = { type: 'arm' } | { type: 'usage' } | { type: 'stop' };
export type ProbeReply =
  | { type: 'ready'; startMs: number }
  | { type: 'event'; at: string }
  | { type: 'usage'; cpuUs: number; rss: number; tokenEvents: number }
  | { type: 'failed'; error: string };

/** The part of chokidar 5 the probe uses; chokidar is no dependency any more (see watcher-cost.ts). */
interface ChokidarWatcher {
  on(event: string, listener: (...args: unknown[]) => void): ChokidarWatcher;
  once(event: string, listener: () => void): ChokidarWatcher;
  close(): Promise<void>;
}
interface ChokidarModule {
  watch(path: string, options: Record<string, unknown>): ChokidarWatcher;
}

const send = (reply: ProbeReply): void => void process.send?.(reply);

async function main(): Promise<void> {
  const [kind, dir, registry] = process.argv.slice(2) as [ProbeKind, string, string];
  let armed = false;
  let tokenEvents = 0;
  const seen = (name: string | undefined): void => {
    if (name === registry || name === undefined) {
      if (!armed) return;
      armed = false;
      send({ type: 'event', at: process.hrtime.bigint().toString() });
    } else if (!name.startsWith('.')) tokenEvents++;
  };
  const t0 = performance.now();
  let stop: () => Promise<void>;
  if (kind === 'chokidar') {
    const moduleName = 'chokidar';
    const chokidar = (await import(moduleName)) as ChokidarModule;
    // hot-file.ts as it was (commit 4f2567f): the file's directory, depth 0, the three
    // named events and `raw`, each filtered by the file's name.
    const watcher = chokidar.watch(dir, { ignoreInitial: true, depth: 0, followSymlinks: true });
    const onEvent = (path: unknown): void => seen(basename(String(path)));
    watcher.on('add', onEvent).on('change', onEvent).on('unlink', onEvent);
    watcher.on('raw', (_event: unknown, path: unknown) => seen(basename(String(path))));
    watcher.on('error', () => seen(undefined));
    await new Promise<void>((resolve) => watcher.once('ready', resolve));
    stop = () => watcher.close();
  } else {
    const unwatch = watchDir(dir, seen, (err) => send({ type: 'failed', error: err.message }));
    stop = () => Promise.resolve(unwatch());
  }
  send({ type: 'ready', startMs: performance.now() - t0 });
  process.on('message', (msg: ProbeRequest) => {
    if (msg.type === 'arm') armed = true;
    else if (msg.type === 'usage') {
      const cpu = process.cpuUsage();
      send({ type: 'usage', cpuUs: cpu.user + cpu.system, rss: process.memoryUsage().rss, tokenEvents });
    } else void stop().then(() => process.exit(0));
  });
}

main().catch((err: unknown) => {
  send({ type: 'failed', error: err instanceof Error ? err.message : String(err) });
  process.exit(1);
});
