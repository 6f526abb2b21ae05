import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';
import { Wakeups } from '../support/wakeups.js';

/** The project's stand-in NOTIFY_SOCKET (this file runs from build/test/tools/). */
export const NOTIFY_RECV = fileURLToPath(new URL('../../../test/tools/notify-recv.py', import.meta.url));

/** Why the receiver cannot run here (no python3), or undefined. */
export function notifyReceiverMissing(): string | undefined {
  const r = spawnSync('python3', ['-c', 'import socket; socket.SO_PASSCRED'], { stdio: 'ignore', timeout: 30_000 });
  return r.status === 0 ? undefined : 'python3 is not installed (the NOTIFY_SOCKET receiver is test/tools/notify-recv.py; Debian: apt-get install python3)';
}

/** Why `systemd-notify` (what the product sends with) cannot run here, or undefined. */
export function systemdNotifyMissing(): string | undefined {
  const r = spawnSync('systemd-notify', ['--version'], { stdio: 'ignore', timeout: 30_000 });
  return r.status === 0 ? undefined : 'systemd-notify is not installed (Debian: apt-get install systemd)';
}

/** One sd_notify datagram as received, with the sender's credentials from the kernel. */
export interface NotifyDatagram {
  pid: number;
  uid: number;
  gid: number;
  /** The datagram's text. */
  raw: string;
  /** Its lines (KEY=VALUE), empty ones left out. */
  assignments: string[];
}

/**
 * test/tools/notify-recv.py bound at `socketPath`, its datagrams collected as they arrive.
 * `systemd-notify`'s own BARRIER=1 synchronisation datagrams are left out: no code under
 * test sends one.
 */
export class NotifyReceiver {
  readonly datagrams: NotifyDatagram[] = [];
  /** Everything the receiver printed to stderr (for a failure's message). */
  stderr = '';
  readonly exited: Promise<unknown>;
  private readonly arrivals = new Wakeups();

  private constructor(
    readonly socketPath: string,
    readonly child: ChildProcess,
  ) {
    // 'close', not 'exit': by then stderr has been read to the end, for the message.
    this.exited = once(child, 'close');
    child.stderr!.on('data', (d: Buffer) => (this.stderr += d.toString()));
    void this.exited.then(() => this.arrivals.wake());
  }

  private add(d: NotifyDatagram): void {
    this.datagrams.push(d);
    this.arrivals.wake();
  }

  /**
   * Resolves with the index of the first datagram at or after `from` that `pred` accepts, as
   * soon as it arrives; rejects at once should the receiver die, and after `timeoutMs`.
   */
  waitFor(pred: (d: NotifyDatagram) => boolean, from: number, what: string, timeoutMs = 30_000): Promise<number> {
    return this.arrivals.until(
      () => {
        for (let i = from; i < this.datagrams.length; i++) if (pred(this.datagrams[i]!)) return i;
        if (!this.running) throw new Error(`the notify receiver died waiting for ${what}: ${this.stderr}`);
        return undefined;
      },
      timeoutMs,
      () => `no datagram with ${what} within ${timeoutMs} ms; got ${JSON.stringify(this.datagrams.map((d) => d.raw))}`,
    );
  }

  /** Starts the receiver; resolves once it listens, rejects at once if it dies first. */
  static async start(socketPath: string): Promise<NotifyReceiver> {
    // stdin is a pipe: should this test process die, its end closes and the receiver exits.
    const child = spawn('python3', [NOTIFY_RECV, socketPath, '600'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const rx = new NotifyReceiver(socketPath, child);
    const listening = new Promise<void>((resolve, reject) => {
      child.once('error', reject);
      void rx.exited.then(() => reject(new Error(`the notify receiver exited before it listened (exit ${child.exitCode ?? child.signalCode}): ${rx.stderr}`)));
      createInterface({ input: child.stdout! }).on('line', (line) => {
        if (line.startsWith('listening ')) {
          resolve();
          return;
        }
        const d = JSON.parse(line) as { pid: number; uid: number; gid: number; msg: string };
        if (d.msg === 'BARRIER=1') return;
        rx.add({ pid: d.pid, uid: d.uid, gid: d.gid, raw: d.msg, assignments: d.msg.split('\n').filter((l) => l !== '') });
      });
    });
    try {
      await listening;
    } catch (err) {
      await rx.close();
      throw err;
    }
    return rx;
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Ends the receiver (it exits on end of stdin) and waits for it. */
  async close(): Promise<void> {
    if (!this.running) return;
    this.child.stdin!.end();
    const killer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await this.exited;
    clearTimeout(killer);
  }
}

/** A receiver at `socketPath` (by default in a fresh temp dir), closed at the end of `t`. */
export async function startNotifyReceiver(t: TapTest, socketPath = join(tempDir('ac-notify-', t), 'notify.sock')): Promise<NotifyReceiver> {
  const rx = await NotifyReceiver.start(socketPath);
  t.teardown(() => rx.close());
  return rx;
}
