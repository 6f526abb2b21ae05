/**
 * First benchmark: direct vs through the forwarder, 1 KB JSON POST, closed-loop load from
 * undici clients in this process. Reports req/s, p50/p99 latency and the forwarder's CPU
 * per request (utime+stime of all its threads from /proc/<pid>/stat). The side-by-side
 * harness with nginx and wrk is the performance issue's work.
 *
 * usage: npm run bench [-- --seconds 5 --concurrency 1,16,64]
 */
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Pool } from 'undici';

const args = process.argv.slice(2);
const arg = (name: string, def: string): string => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] ? (args[i + 1] as string) : def;
};
const seconds = Number(arg('seconds', '5'));
const concurrencies = arg('concurrency', '1,16,64').split(',').map(Number);
const CLI = resolve(fileURLToPath(new URL('.', import.meta.url)), '../../dist/cli.js');
const CLK_TCK = 100;

const payload = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 1, result: { pad: 'x'.repeat(960) } }));

function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]);
}

async function load(url: string, concurrency: number, ms: number): Promise<{ count: number; lat: number[] }> {
  const u = new URL(url);
  const pool = new Pool(u.origin, { connections: concurrency, pipelining: 1 });
  const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { pad: 'y'.repeat(900) } });
  const lat: number[] = [];
  const end = Date.now() + ms;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (Date.now() < end) {
        const t0 = process.hrtime.bigint();
        const res = await pool.request({ path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json' }, body });
        await res.body.arrayBuffer();
        if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}`);
        lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
    }),
  );
  await pool.close();
  return { count: lat.length, lat: lat.sort((a, b) => a - b) };
}

const pct = (xs: number[], p: number): number => xs[Math.min(xs.length - 1, Math.floor((xs.length * p) / 100))] ?? NaN;

async function main(): Promise<void> {
  const upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': payload.length });
      res.end(payload);
    });
  });
  upstream.listen(0, '127.0.0.1');
  await new Promise((r) => upstream.once('listening', r));
  const upPort = (upstream.address() as AddressInfo).port;

  const state = mkdtempSync(join(tmpdir(), 'ac-bench-'));
  mkdirSync(join(state, 'mcp-forwarder'), { recursive: true });
  const tokenFile = join(state, 'mcp-forwarder', 'bench.token');
  writeFileSync(tokenFile, 'bench-token-value\n', { mode: 0o600 });
  writeFileSync(
    join(state, 'mcp-forwarder', 'instances.json'),
    JSON.stringify({ bench_binding_01: { instanceId: 'bench', upstreamUrl: `http://127.0.0.1:${upPort}/mcp`, tokenFile } }),
  );
  // Default log level (info): one access line per request is part of the real cost.
  const fwd = spawn(process.execPath, [CLI, 'forwarder', '--listen', '127.0.0.1:0', '--state-dir', state], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const port = await new Promise<number>((resolvePort) => {
    createInterface({ input: fwd.stdout! }).on('line', (line) => {
      if (line.includes('"forwarder listening"')) resolvePort((JSON.parse(line) as { port: number }).port);
    });
  });

  const rows: string[] = [];
  rows.push('| target | concurrency | req/s | p50 ms | p99 ms | forwarder CPU µs/req |', '|---|---|---|---|---|---|');
  for (const c of concurrencies) {
    for (const [name, url] of [
      ['direct', `http://127.0.0.1:${upPort}/mcp`],
      ['forwarder', `http://127.0.0.1:${port}/i/bench_binding_01/mcp`],
    ] as const) {
      await load(url, c, 500); // warm-up
      const before = cpuTicks(fwd.pid!);
      const r = await load(url, c, seconds * 1000);
      const cpu = ((cpuTicks(fwd.pid!) - before) / CLK_TCK) * 1e6;
      rows.push(
        `| ${name} | ${c} | ${Math.round(r.count / seconds)} | ${pct(r.lat, 50).toFixed(3)} | ${pct(r.lat, 99).toFixed(3)} | ${name === 'forwarder' ? Math.round(cpu / r.count) : '-'} |`,
      );
    }
  }
  fwd.kill('SIGTERM');
  upstream.close();
  process.stdout.write(`${rows.join('\n')}\n`);
  process.exit(0);
}

void main();
