/** Starting and querying the upstream process (bench/upstream.ts). */
import type { ChildProcess } from 'node:child_process';
import { request } from 'node:http';
import { createInterface } from 'node:readline';
import { UPSTREAM_JS } from './paths.js';
import { NOFILE, spawnTracked, stopChild } from './proc.js';
import type { PortStats, UpstreamHello } from './wire.js';

export interface Upstream {
  pid: number;
  ports: number[];
  child: ChildProcess;
  stats(): Promise<Record<string, PortStats>>;
  ack(stream: string, n: number): Promise<void>;
  stop(): Promise<void>;
}

export function httpGetJson<T>(url: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.once('end', () => {
        try {
          resolve(JSON.parse(text) as T);
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
    });
    req.once('error', reject);
    req.end();
  });
}

export async function startUpstream(portCount: number): Promise<Upstream> {
  const child = spawnTracked(process.execPath, [UPSTREAM_JS, String(portCount)], { stdio: ['ignore', 'pipe', 'inherit'], nofile: NOFILE });
  const hello = await new Promise<UpstreamHello>((resolve, reject) => {
    const rl = createInterface({ input: child.stdout! });
    rl.once('line', (line) => resolve(JSON.parse(line) as UpstreamHello));
    child.once('exit', (code) => reject(new Error(`bench upstream exited (${code}) before listening`)));
  });
  const first = hello.ports[0] as number;
  return {
    pid: child.pid as number,
    ports: hello.ports,
    child,
    stats: () => httpGetJson<Record<string, PortStats>>(`http://127.0.0.1:${first}/stats`),
    ack: (stream, n) =>
      new Promise<void>((resolve, reject) => {
        const req = request(`http://127.0.0.1:${first}/ack?s=${encodeURIComponent(stream)}&n=${n}`, (res) => {
          res.resume();
          res.once('end', () => resolve());
        });
        req.once('error', reject);
        req.end();
      }),
    stop: () => stopChild(child),
  };
}
