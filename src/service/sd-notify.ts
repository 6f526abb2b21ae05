import type { Logger } from '../log/logger.js';

/**
 * sd_notify. Node has no unix datagram sockets, so messages go through the
 * `systemd-notify` binary, with `--pid` naming us so systemd attributes them to the main
 * process (NotifyAccess=all covers the helper's own pid otherwise). Without
 * NOTIFY_SOCKET every call is a no-op, so the same code runs under systemd and not.
 */
export interface Notifier {
  readonly enabled: boolean;
  ready(status: string): Promise<void>;
  status(status: string): Promise<void>;
  reloading(): Promise<void>;
  stopping(): Promise<void>;
  /** Starts WATCHDOG=1 pings at half of WATCHDOG_USEC, if set for us. Returns a stop function. */
  startWatchdog(): () => void;
}

export interface NotifierOptions {
  env?: NodeJS.ProcessEnv;
  log?: Logger;
  binary?: string;
}

function sanitize(text: string): string {
  // One datagram, one assignment per line: a newline in a status would inject another.
  return text.replace(/[\r\n]+/g, ' ');
}

export function createNotifier(options: NotifierOptions = {}): Notifier {
  const env = options.env ?? process.env;
  const socket = env.NOTIFY_SOCKET;
  const binary = options.binary ?? 'systemd-notify';
  const enabled = Boolean(socket);

  const send = async (...assignments: string[]): Promise<void> => {
    if (!enabled) return;
    try {
      // Loaded at the first message, under systemd only: outside it (tests, dev, every
      // one-shot command) no service pays execa's hundred modules at start.
      const { execa } = await import('execa');
      await execa(binary, [`--pid=${process.pid}`, ...assignments], {
        env: { NOTIFY_SOCKET: socket },
        extendEnv: false,
        stdin: 'ignore',
        timeout: 5000,
        // execa's cleanup installs signal handlers that would swallow the watchdog's SIGABRT.
        cleanup: false,
      });
    } catch (err) {
      options.log?.warn({ err: { message: (err as Error).message.split('\n')[0] } }, 'sd_notify failed');
    }
  };

  return {
    enabled,
    ready: (status) => send('READY=1', `STATUS=${sanitize(status)}`),
    status: (status) => send(`STATUS=${sanitize(status)}`),
    reloading: () => {
      // systemd ≥ 253 wants the monotonic time with RELOADING=1 to order the reload.
      const usec = process.hrtime.bigint() / 1000n;
      return send('RELOADING=1', `MONOTONIC_USEC=${usec}`);
    },
    stopping: () => send('STOPPING=1'),
    startWatchdog: () => {
      const usec = Number(env.WATCHDOG_USEC);
      const pid = env.WATCHDOG_PID ? Number(env.WATCHDOG_PID) : process.pid;
      if (!enabled || !Number.isFinite(usec) || usec <= 0 || pid !== process.pid) return () => undefined;
      const timer = setInterval(() => void send('WATCHDOG=1'), Math.max(1, Math.floor(usec / 2000)));
      timer.unref();
      void send('WATCHDOG=1');
      return () => clearInterval(timer);
    },
  };
}
