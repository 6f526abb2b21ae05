/**
 * `npm run bench -- --link`: the host link's figures (issue 11, docs/host-link.md).
 *
 * Real CLI processes on one scratch state root: `link` (renewals, the desired-state long
 * poll, presence), `renew apply --watch`, `forwarder` and `cli-proxy`, against the mock
 * host Gateway of SPEC §8 in this process, whose bindings point at a loopback upstream that
 * answers 200. Measured, each from the moment the Gateway publishes the new state:
 *
 * - connect → serving: the forwarder answers the new binding 200 through a real request
 *   (the state reaches the link, apply reconciles, the link renews the new slot, apply
 *   writes the token file)
 * - disconnect → token file deleted, and disconnect → the forwarder answers 404
 * - the link's CPU (utime+stime from /proc/<pid>/stat) and RSS, idle over 60 s, and with a
 *   desired state of 10 000 bindings: time to apply it, to renew all of them, then idle.
 *
 * Not a test: it asserts nothing about time, it prints figures (JSON, then a Markdown
 * table for docs/host-link.md).
 */
import { once } from 'node:events';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { cpus, loadavg, release, tmpdir, totalmem } from 'node:os';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { request } from 'undici';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { cpuMicros, freePort, partNodeFlags, rssBytes, sleep, spawnTracked, stopChild, waitForJsonLine, waitForPort } from './lib/proc.js';
import { percentile } from './lib/stats.js';

const HOST_ID = 'bench-host';
const MiB = 1024 * 1024;

export interface LinkBenchOptions {
  cli?: string;
  /** Connect/disconnect cycles: each is one connect and one disconnect (default 100). */
  cycles?: number;
  /** Idle window for CPU/RSS, ms (default 60 000). */
  idleMs?: number;
  /** Bindings in the large state (default 10 000). */
  bindings?: number;
  /** The link's `--renew-concurrency` (default: the link's own default). */
  renewConcurrency?: number;
}

export interface Spread {
  n: number;
  p50: number;
  p99: number;
  max: number;
}

/** p50/p99/max of `values`, rounded to a tenth (or as `r` rounds). */
export function spread(values: number[], r = (x: number): number => Math.round(x * 10) / 10): Spread {
  const s = [...values].sort((a, b) => a - b);
  return { n: s.length, p50: r(percentile(s, 50)), p99: r(percentile(s, 99)), max: r(s.at(-1) ?? NaN) };
}

export interface ProcFigures {
  cpuPercent: number;
  rssMiB: number;
  peakRssMiB: number;
}

/** VmHWM: the peak RSS of the process so far. */
export function peakRssBytes(pid: number): number {
  const m = /^VmHWM:\s+(\d+)\s+kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? NaN) * 1024;
}

/** CPU share and RSS of `pid` over `ms` of idling (RSS: the last of one sample a second). */
export async function idleFigures(pid: number, ms: number): Promise<ProcFigures> {
  const cpu0 = cpuMicros(pid);
  const t0 = performance.now();
  let rss = rssBytes(pid);
  while (performance.now() - t0 < ms) {
    await sleep(1000);
    rss = rssBytes(pid);
  }
  const elapsed = performance.now() - t0;
  return {
    cpuPercent: Math.round(((cpuMicros(pid) - cpu0) / 1000 / elapsed) * 10_000) / 100,
    rssMiB: Math.round((rss / MiB) * 10) / 10,
    peakRssMiB: Math.round((peakRssBytes(pid) / MiB) * 10) / 10,
  };
}

/** Polls until `probe` is true; resolves with the ms since `t0`. */
export async function until(probe: () => boolean | Promise<boolean>, t0: number, what: string, timeoutMs = 60_000, everyMs = 1): Promise<number> {
  for (;;) {
    if (await probe()) return performance.now() - t0;
    if (performance.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** A loopback upstream answering every request 200 with a JSON-RPC result. */
export async function okUpstream(): Promise<{ url: string; close: () => Promise<void> }> {
  const server = createServer((req, res) => {
    req.resume();
    req.once('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"jsonrpc":"2.0","id":1,"result":{}}');
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

export interface Part {
  pid: number;
  log: string;
  stop: () => Promise<void>;
}

/** `node <nodeFlags…> <cli> <args…>`: node's own flags (the part's unit's, bench/lib/proc.ts partNodeFlags) before the script. */
export function startPart(cli: string, dir: string, name: string, args: string[], nodeFlags: readonly string[] = []): Part {
  const log = join(dir, `${name}.log`);
  const out = openSync(log, 'a');
  const env = { ...process.env };
  delete env.NOTIFY_SOCKET;
  delete env.WATCHDOG_USEC;
  const child = spawnTracked(process.execPath, [...nodeFlags, cli, ...args, '--log-level', 'info'], { stdio: ['ignore', out, out], env, cwd: dir });
  closeSync(out);
  return { pid: child.pid as number, log, stop: () => stopChild(child, 'SIGTERM') };
}

export async function status(url: string): Promise<number> {
  const r = await request(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  });
  await r.body.dump();
  return r.statusCode;
}

export function appliedVersion(file: string): number {
  try {
    const v = (JSON.parse(readFileSync(file, 'utf8')) as { version?: unknown; appliedAt?: unknown }) ?? {};
    return typeof v.version === 'number' && v.appliedAt ? v.version : -1;
  } catch {
    return -1;
  }
}

export function machine(): Record<string, string | number> {
  return {
    cpu: cpus()[0]?.model ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round((totalmem() / 1024 ** 3) * 10) / 10,
    kernel: release(),
    node: process.version,
    loadavg1AtStart: Math.round((loadavg()[0] ?? 0) * 100) / 100,
  };
}

/** A scratch state root laid out as install makes it, and an enrolled host's credential file. */
export function scratchHost(prefix: string): { dir: string; state: string; handoff: string; credential: string; credentialFile: string } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const state = join(dir, 'state');
  const handoff = join(state, 'handoff');
  for (const d of [join(handoff, 'inbox'), join(handoff, 'slots')]) mkdirSync(d, { recursive: true });
  for (const d of ['mcp-forwarder', 'cli-proxy']) mkdirSync(join(state, d), { recursive: true, mode: 0o700 });
  const credential = `hostcred-bench-${Math.random().toString(36).slice(2)}${Date.now()}`;
  const credentialFile = join(dir, 'host-credential');
  writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
  return { dir, state, handoff, credential, credentialFile };
}

export async function runLinkBench(log: (line: string) => void, options: LinkBenchOptions = {}): Promise<Record<string, unknown>> {
  const cli = options.cli ?? DEFAULT_CLI;
  const cycles = options.cycles ?? 100;
  const idleMs = options.idleMs ?? 60_000;
  const many = options.bindings ?? 10_000;
  const host = machine();
  const { dir, state, handoff, credential, credentialFile } = scratchHost('ac-bench-link-');

  // Tokens outlive the run: every renewal measured is a new slot's first.
  const gw = await MockHostGateway.start({ staticHosts: { [HOST_ID]: credential }, tokenLifetimeMs: 6 * 3600_000 });
  const upstream = await okUpstream();
  const parts: Part[] = [];
  try {
    const fwdPort = await freePort();
    const cliPort = await freePort();
    const forwarder = startPart(cli, dir, 'forwarder', ['forwarder', '--state-dir', state, '--listen', `127.0.0.1:${fwdPort}`], await partNodeFlags(cli, 'forwarder'));
    const cliProxy = startPart(cli, dir, 'cli-proxy', ['cli-proxy', '--state-dir', state, '--listen', `127.0.0.1:${cliPort}`], await partNodeFlags(cli, 'cli-proxy'));
    parts.push(forwarder, cliProxy);
    await Promise.all([waitForPort(fwdPort, 20_000), waitForPort(cliPort, 20_000)]);
    const apply = startPart(cli, dir, 'apply', ['renew', 'apply', '--watch', '--state-dir', state, '--handoff', handoff, '--shim-dir', join(dir, 'shims')], await partNodeFlags(cli, 'apply'));
    parts.push(apply);
    await waitForJsonLine(apply.log, (l) => l.msg === 'apply watching', 20_000);
    // prettier-ignore
    const link = startPart(cli, dir, 'link', [
      'link', '--gateway', gw.url, '--credential', credentialFile, '--handoff', handoff, '--state-dir', state, '--host-id', HOST_ID,
      '--forwarder-health', `http://127.0.0.1:${fwdPort}/healthz`, '--cli-proxy-health', `http://127.0.0.1:${cliPort}/healthz`,
      ...(options.renewConcurrency === undefined ? [] : ['--renew-concurrency', String(options.renewConcurrency)]),
    ], await partNodeFlags(cli, 'link'));
    parts.push(link);
    const applied = join(handoff, 'applied-state.json');
    await until(() => appliedVersion(applied) === gw.control.version, performance.now(), 'the first state applied', 30_000, 20);
    log(`link bench: parts up (link pid ${link.pid}); ${cycles} connect/disconnect cycles`);

    const connect: number[] = [];
    const deleted: number[] = [];
    const gone404: number[] = [];
    const t0Run = performance.now();
    for (let i = 0; i < cycles; i++) {
      const id = `bind_bench_${String(i).padStart(6, '0')}`;
      const instanceId = `bench-${i}`;
      const url = `http://127.0.0.1:${fwdPort}/i/${id}/mcp`;
      const tokenFile = join(state, 'mcp-forwarder', `${instanceId}.token`);
      let t0 = performance.now();
      gw.control.connectBinding(id, { instanceId, upstreamUrl: `${upstream.url}/mcp/${i}` });
      connect.push(await until(async () => (await status(url)) === 200, t0, `binding ${i} served`, 60_000, 2));
      t0 = performance.now();
      gw.control.disconnectBinding(id);
      const [d, g] = await Promise.all([
        until(() => !existsSync(tokenFile), t0, `token file ${i} deleted`),
        until(async () => (await status(url)) === 404, t0, `binding ${i} answered 404`, 60_000, 2),
      ]);
      deleted.push(d);
      gone404.push(g);
      if ((i + 1) % 25 === 0) log(`  ${i + 1}/${cycles} cycles`);
    }
    const changesS = Math.round((performance.now() - t0Run) / 100) / 10;

    log(`link bench: idle ${idleMs / 1000} s`);
    await until(() => appliedVersion(applied) === gw.control.version, performance.now(), 'the last state applied', 30_000, 20);
    const idle = await idleFigures(link.pid, idleMs);

    log(`link bench: a desired state of ${many} bindings`);
    const cpuBefore = cpuMicros(link.pid);
    const applyCpuBefore = cpuMicros(apply.pid);
    const bindings = Object.fromEntries(
      Array.from({ length: many }, (_, i) => [`bind_many_${String(i).padStart(6, '0')}`, { instanceId: `many-${i}`, upstreamUrl: `${upstream.url}/mcp/many/${i}` }]),
    );
    const t0 = performance.now();
    gw.control.connectBindings(bindings);
    const version = gw.control.version;
    const applyMs = await until(() => appliedVersion(applied) === version, t0, `${many} bindings applied`, 900_000, 10);
    const linkCpuToApplyMs = (cpuMicros(link.pid) - cpuBefore) / 1000;
    const applyCpuMs = (cpuMicros(apply.pid) - applyCpuBefore) / 1000;
    const tokens = (): number => readdirSync(join(state, 'mcp-forwarder')).filter((f) => f.startsWith('many-') && f.endsWith('.token')).length;
    const peakUntilAppliedMiB = Math.round((peakRssBytes(link.pid) / MiB) * 10) / 10;
    // The new slots are then renewed (--renew-concurrency at a time): that window is measured, not waited out
    // (see docs/host-link.md for the rate, and why it is not idle).
    log(`link bench: ${idleMs / 1000} s with ${many} bindings in force (renewing their new slots)`);
    const renewedBefore = tokens();
    const window = await idleFigures(link.pid, idleMs);
    const renewedInWindow = tokens() - renewedBefore;
    const r = (x: number): number => Math.round(x);
    return {
      machine: host,
      changes: { cycles, seconds: changesS, connectToServingMs: spread(connect), disconnectToDeletedMs: spread(deleted), disconnectTo404Ms: spread(gone404) },
      linkIdle: { seconds: idleMs / 1000, ...idle },
      large: {
        bindings: many,
        applyMs: r(applyMs),
        linkCpuMsUntilApplied: r(linkCpuToApplyMs),
        applyCpuMsUntilApplied: r(applyCpuMs),
        linkPeakRssMiBUntilApplied: peakUntilAppliedMiB,
        window: { seconds: idleMs / 1000, ...window, renewed: renewedInWindow, renewedPerSecond: Math.round((renewedInWindow / (idleMs / 1000)) * 10) / 10 },
      },
      gateway: gw.control.stats(),
      presences: gw.control.presences.length,
    };
  } finally {
    for (const p of parts.reverse()) await p.stop();
    await gw.close();
    await upstream.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The figures as the Markdown table of docs/host-link.md. */
export function linkMarkdown(res: Record<string, unknown>): string {
  const c = res.changes as { cycles: number; connectToServingMs: Spread; disconnectToDeletedMs: Spread; disconnectTo404Ms: Spread };
  const row = (name: string, s: Spread): string => `| ${name} | ${s.n} | ${s.p50} | ${s.p99} | ${s.max} |`;
  return [
    '| from the state published to … (ms) | n | p50 | p99 | max |',
    '|---|---|---|---|---|',
    row('connect → the forwarder answers 200', c.connectToServingMs),
    row('disconnect → token file deleted', c.disconnectToDeletedMs),
    row('disconnect → the forwarder answers 404', c.disconnectTo404Ms),
  ].join('\n');
}

export async function runLink(log: (line: string) => void, cli?: string): Promise<number> {
  const res = await runLinkBench(log, cli === undefined ? {} : { cli });
  process.stdout.write(`${JSON.stringify(res, null, 2)}\n\n${linkMarkdown(res)}\n`);
  return 0;
}
