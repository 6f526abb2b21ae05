/**
 * Holds many idle SSE streams open, run as its own process (its own fd limit):
 * `node build/bench/idle-clients.js '<json config>'`. Opens `count` raw TCP connections,
 * at most `parallel` handshakes in flight, sends a GET, waits for a 200 header block, and
 * prints {"ready":n,"failed":m,"ms":t} once all are open. When stdin closes it resets
 * every connection (RST: no TIME_WAIT left to eat the ephemeral ports of the next test)
 * and exits.
 */
import { connect, type Socket } from 'node:net';

interface Config {
  host: string;
  port: number;
  path: string;
  count: number;
  parallel: number;
}

const cfg = JSON.parse(process.argv[2] ?? '{}') as Config;
const sockets: Socket[] = [];
let ready = 0;
let failed = 0;
let firstError: string | undefined;

function openOne(): Promise<void> {
  return new Promise((resolve) => {
    const s = connect({ host: cfg.host, port: cfg.port });
    sockets.push(s);
    let head = '';
    let done = false;
    const finish = (ok: boolean, why?: string): void => {
      if (done) return;
      done = true;
      if (ok) ready++;
      else {
        failed++;
        firstError ??= why;
      }
      resolve();
    };
    s.setEncoding('latin1');
    s.once('connect', () => {
      s.write(`GET ${cfg.path} HTTP/1.1\r\nHost: ${cfg.host}:${cfg.port}\r\nAccept: text/event-stream\r\n\r\n`);
    });
    s.on('data', (d: string) => {
      if (done) return;
      head += d;
      if (head.includes('\r\n\r\n')) finish(head.startsWith('HTTP/1.1 200'), head.split('\r\n')[0]);
    });
    s.once('error', (err) => finish(false, err.message));
    s.once('close', () => finish(false, 'closed before headers'));
  });
}

async function main(): Promise<void> {
  const started = Date.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(cfg.parallel, cfg.count) }, async () => {
      while (next < cfg.count) {
        next++;
        await openOne();
      }
    }),
  );
  process.stdout.write(`${JSON.stringify({ ready, failed, firstError, ms: Date.now() - started })}\n`);
  process.stdin.resume();
  process.stdin.once('close', () => {
    for (const s of sockets) if (!s.destroyed) s.resetAndDestroy();
    process.exit(0);
  });
}

void main();
