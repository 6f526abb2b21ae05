/**
 * `npm run bench -- --scale`: how a host grows from 10 to 10 000 bindings (issue 23 item 2,
 * docs/scale.md). For each N (bindings; providers N/10, one command each), a fresh state
 * root and real CLI processes (`link`, `renew apply --watch`, `forwarder`, `cli-proxy`)
 * against the mock host Gateway in this process, which publishes the whole state as one
 * version. From that moment (each part's own log time):
 *
 * - the link handed it over (desired-state.json renamed in)
 * - apply applied it (applied-state.json; its log line), and rendered the shims
 * - the forwarder loaded the registry, the cli-proxy the catalog (with N and N/10 entries)
 * - a sample of bindings and providers answers (503 `token_unavailable` until its token is
 *   there, then 200; 404 before), polled by this process: "in force" is the last of these,
 *   the registry and catalog loads and the shims (apply's "applied", which also waits for
 *   the new slot files, is reported beside it)
 * - one binding disconnected: published → the forwarder answers 404 for it (right after in
 *   force, while the first renewals run, and again after the idle window)
 * - every binding and provider holds a token (the link's renewals; reported, not the goal here)
 * then each part's RSS and CPU over `idleMs`, `idleAfterMs` after every token is held (or
 * the wait gave up: `renewing` says so, and then the window is not idle); and the CPU per
 * renewal of the link and apply from in force to every token held.
 *
 * CPU is utime+stime from /proc (robust under load); the load average is printed next to
 * every run. Not a test: nothing is asserted. `renderScaleSvg` draws the growth plot.
 */
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { appliedVersion, machine, okUpstream, peakRssBytes, scratchHost, startPart, until, type Part } from './link.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { cpuMicros, freePort, partNodeFlags, rssBytes, sleep, waitForJsonLine, waitForPort } from './lib/proc.js';

const HOST_ID = 'bench-host';
const MiB = 1024 * 1024;
const PART_NAMES = ['link', 'apply', 'forwarder', 'cli-proxy'] as const;
type PartName = (typeof PART_NAMES)[number];

export interface ScaleOptions {
  cli?: string;
  sizes?: number[];
  /** Idle window per size, ms (default 10 000). */
  idleMs?: number;
  /**
   * From every token held to the idle window, ms (default 5 000). The link's periodic
   * checks of slots/ (every 60 s) rescan once after the renewals' burst of slot files:
   * more than two periods puts the window at rest.
   */
  idleAfterMs?: number;
  /** How long to wait for every token before measuring idle anyway (default 240 s). */
  tokensTimeoutMs?: number;
  /** The link's `--renew-concurrency` (default 8: the tokens are not what is measured here). */
  renewConcurrency?: number;
  /** Extra node flags per part (e.g. `--cpu-prof` for apply), for finding where time goes. */
  nodeFlags?: Partial<Record<PartName, string[]>>;
  /** Keep the scratch directory (profiles, logs). */
  keep?: boolean;
}

export interface ScaleRun {
  bindings: number;
  providers: number;
  loadavg1: number;
  /** ms from published, by each part's log (or this process's probe). */
  handedOverMs: number;
  appliedMs: number;
  shimsMs: number;
  registryLoadedMs: number;
  catalogLoadedMs: number;
  sampleServedMs: number;
  inForceMs: number;
  allTokensMs: number | null;
  /** CPU each part spent from published to in force, ms. */
  cpuToInForceMs: Record<PartName, number>;
  /**
   * One binding disconnected with the rest in force: published → the forwarder answers 404
   * for it, and the CPU each part spent meanwhile. `busy` right after in force (renewals
   * running), `quiet` after the idle window.
   */
  disconnect?: { busy: DisconnectRun; quiet: DisconnectRun };
  idle: { seconds: number; renewing: boolean; loadavg1: number; cpuPercent: Record<PartName, number>; rssMiB: Record<PartName, number> };
  /**
   * The renewals from in force until every token was held (null: not within the wait):
   * how many, and the CPU the link and apply spent on them, per renewal. At a token
   * lifetime L the slots renew at (bindings + providers) / (⅔·L) per second in the steady
   * state, each costing about this (docs/scale.md, "Idle").
   */
  renewals: { count: number; linkCpuMsPer: number; applyCpuMsPer: number } | null;
  /**
   * Each part's highest RSS from its start to every token held (VmHWM): the state's
   * arrival and the renewals' burst, where the link and apply peak (docs/scale.md, "The
   * burst's peak").
   */
  burstPeakRssMiB?: Record<PartName, number>;
}

export interface DisconnectRun {
  loadavg1: number;
  /** published → apply's log line for that version. */
  appliedMs: number;
  to404Ms: number;
  cpuMs: Record<PartName, number>;
}

interface LogLine {
  time?: string;
  msg?: string;
  [k: string]: unknown;
}

function logLines(file: string): LogLine[] {
  const out: LogLine[] = [];
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as LogLine);
    } catch {
      // a line being written
    }
  }
  return out;
}

/** The epoch ms of the first log line after `since` matching `pred`. */
async function logTime(file: string, since: number, pred: (l: LogLine) => boolean, what: string, timeoutMs: number): Promise<number> {
  const t0 = Date.now();
  for (;;) {
    const hit = logLines(file).find((l) => l.time !== undefined && Date.parse(l.time) >= since - 5 && pred(l));
    if (hit?.time) return Date.parse(hit.time);
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what} in ${file}`);
    await sleep(20);
  }
}

async function statusOf(url: string, post: boolean): Promise<number> {
  const r = await request(url, post ? { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' } : { method: 'GET' });
  await r.body.dump();
  return r.statusCode;
}

/** Up to `k` indices spread over 0..n-1 (first and last included). */
function sampleIndices(n: number, k: number): number[] {
  if (n <= k) return Array.from({ length: n }, (_, i) => i);
  return [...new Set(Array.from({ length: k }, (_, j) => Math.round((j * (n - 1)) / (k - 1))))];
}

const bindingId = (i: number): string => `bind_scale_${String(i).padStart(6, '0')}`;
const providerName = (i: number): string => `prov-${i}`;

async function oneSize(n: number, o: Required<Omit<ScaleOptions, 'sizes' | 'nodeFlags' | 'keep'>> & Pick<ScaleOptions, 'nodeFlags' | 'keep'>, log: (l: string) => void): Promise<ScaleRun> {
  const providers = Math.max(1, Math.floor(n / 10));
  const { dir, state, handoff, credential, credentialFile } = scratchHost('ac-bench-scale-');
  const gw = await MockHostGateway.start({ staticHosts: { [HOST_ID]: credential }, tokenLifetimeMs: 6 * 3600_000 });
  const upstream = await okUpstream();
  const parts = new Map<PartName, Part>();
  try {
    const fwdPort = await freePort();
    const cliPort = await freePort();
    // Each part with the node flags its unit runs it with (this build's), then any asked for.
    const shipped = new Map(await Promise.all(PART_NAMES.map(async (p) => [p, await partNodeFlags(o.cli, p)] as const)));
    const start = (name: PartName, args: string[]): Part => {
      const part = startPart(o.cli, dir, name, args, [...(shipped.get(name) ?? []), ...(o.nodeFlags?.[name] ?? [])]);
      parts.set(name, part);
      return part;
    };
    start('forwarder', ['forwarder', '--state-dir', state, '--listen', `127.0.0.1:${fwdPort}`]);
    start('cli-proxy', ['cli-proxy', '--state-dir', state, '--listen', `127.0.0.1:${cliPort}`]);
    await Promise.all([waitForPort(fwdPort, 120_000), waitForPort(cliPort, 120_000)]);
    const apply = start('apply', ['renew', 'apply', '--watch', '--state-dir', state, '--handoff', handoff, '--shim-dir', join(dir, 'shims'), '--proxy-url', `http://127.0.0.1:${cliPort}`]);
    await waitForJsonLine(apply.log, (l) => l.msg === 'apply watching', 120_000);
    // prettier-ignore
    start('link', [
      'link', '--gateway', gw.url, '--credential', credentialFile, '--handoff', handoff, '--state-dir', state, '--host-id', HOST_ID,
      '--forwarder-health', `http://127.0.0.1:${fwdPort}/healthz`, '--cli-proxy-health', `http://127.0.0.1:${cliPort}/healthz`,
      '--renew-concurrency', String(o.renewConcurrency),
    ]);
    const applied = join(handoff, 'applied-state.json');
    await until(() => appliedVersion(applied) === gw.control.version, performance.now(), 'the first state applied', 120_000, 20);
    // Settled: the parts' start-up is not part of the figures.
    await sleep(1000);

    const bindings = Object.fromEntries(Array.from({ length: n }, (_, i) => [bindingId(i), { instanceId: `scale-${i}`, upstreamUrl: `${upstream.url}/mcp/${i}` }]));
    const catalog = Object.fromEntries(
      Array.from({ length: providers }, (_, i) => [
        providerName(i),
        { upstream: `${upstream.url}/api/${i}`, inject: { type: 'header' as const, name: 'Authorization', value: 'Bearer {token}' }, commands: [{ name: `tool-${i}`, env: { TOOL_BASE_URL: '{baseUrl}' } }] },
      ]),
    );
    const cpu0 = new Map([...parts].map(([k, p]) => [k, cpuMicros(p.pid)]));
    const loadavg1 = Math.round((loadavg()[0] ?? 0) * 100) / 100;
    log(`scale: ${n} bindings, ${providers} providers (load ${loadavg1})`);
    // Published once the Gateway holds it (building the stand-in's 10 000 slots is not the host's time).
    gw.control.connectMany(bindings, catalog);
    const published = Date.now();
    const version = gw.control.version;
    const timeout = 600_000;
    const part = (p: PartName): Part => parts.get(p) as Part;
    // In force: a sample of bindings and providers answers (503 until its token is there), no more 404.
    const bSample = sampleIndices(n, 20);
    const pSample = sampleIndices(providers, 10);
    const pending = new Set([...bSample.map((i) => `http://127.0.0.1:${fwdPort}/i/${bindingId(i)}/mcp`), ...pSample.map((i) => `http://127.0.0.1:${cliPort}/p/${providerName(i)}/v1`)]);
    const sampleServed = until(
      async () => {
        for (const url of [...pending]) if ((await statusOf(url, url.includes('/i/'))) !== 404) pending.delete(url);
        return pending.size === 0;
      },
      performance.now(),
      'the sample answering',
      timeout,
      5,
    ).then(() => Date.now());
    const [handedOver, appliedAt, shims, registry, cat, served] = await Promise.all([
      logTime(part('link').log, published, (l) => l.msg === 'desired state handed over to apply' && l.version === version, 'hand-over', timeout),
      logTime(part('apply').log, published, (l) => l.msg === 'desired state applied' && l.version === version, 'applied', timeout),
      logTime(part('apply').log, published, (l) => l.msg === 'shims rendered' && l.written === providers, 'shims', timeout),
      logTime(part('forwarder').log, published, (l) => l.msg === 'registry loaded' && l.instances === n, 'registry loaded', timeout),
      logTime(part('cli-proxy').log, published, (l) => l.msg === 'catalog loaded' && l.providers === providers, 'catalog loaded', timeout),
      sampleServed,
    ]);
    const cpuToInForceMs = Object.fromEntries(PART_NAMES.map((p) => [p, Math.round((cpuMicros(part(p).pid) - (cpu0.get(p) ?? 0)) / 1000)])) as Record<PartName, number>;
    // In force: every binding and provider loaded and answering, the shims rendered. apply's
    // `desired state applied` (the slot files written, applied-state.json) is its own
    // column: since session 10 it comes after the registry (src/apply/reconcile.ts).
    const inForce = Math.max(served, shims, registry, cat);
    log(`  in force after ${inForce - published} ms`);
    // Bindings outside the sample, so the sample's figures are not disturbed.
    const sampled = new Set(bSample);
    const spare = Array.from({ length: n }, (_, i) => n - 1 - i).filter((i) => !sampled.has(i));
    const disconnectOne = async (): Promise<DisconnectRun | undefined> => {
      const i = spare.shift();
      if (i === undefined) return undefined;
      const url = `http://127.0.0.1:${fwdPort}/i/${bindingId(i)}/mcp`;
      const load = Math.round((loadavg()[0] ?? 0) * 100) / 100;
      const c = new Map(PART_NAMES.map((p) => [p, cpuMicros(part(p).pid)]));
      // Published once the Gateway holds it (its own validation of the new state is not the host's time).
      gw.control.disconnectBinding(bindingId(i));
      const t = Date.now();
      const v = gw.control.version;
      const [done, gone] = await Promise.all([
        logTime(part('apply').log, t, (l) => l.msg === 'desired state applied' && l.version === v, 'disconnect applied', timeout),
        until(async () => (await statusOf(url, true)) === 404, performance.now(), 'the disconnected binding answering 404', timeout, 5).then(() => Date.now()),
      ]);
      const cpuMs = Object.fromEntries(PART_NAMES.map((p) => [p, Math.round((cpuMicros(part(p).pid) - (c.get(p) ?? 0)) / 1000)])) as Record<PartName, number>;
      const run = { loadavg1: load, appliedMs: done - t, to404Ms: gone - t, cpuMs };
      log(`  one binding disconnected: 404 after ${run.to404Ms} ms (load ${load}; CPU ms ${PART_NAMES.map((p) => cpuMs[p]).join(' / ')})`);
      return run;
    };
    const busy = await disconnectOne();
    log('  waiting for every token');
    const tokens = (): number =>
      readdirSync(join(state, 'mcp-forwarder')).filter((f) => f.startsWith('scale-') && f.endsWith('.token')).length +
      readdirSync(join(state, 'cli-proxy')).filter((f) => f.startsWith('prov-') && f.endsWith('.token')).length;
    const tokens0 = tokens();
    const r0 = new Map(PART_NAMES.map((p) => [p, cpuMicros(part(p).pid)]));
    let allTokensMs: number | null = null;
    let renewals: ScaleRun['renewals'] = null;
    try {
      await until(() => tokens() >= n + providers - 1, performance.now(), 'every token', o.tokensTimeoutMs, 250);
      allTokensMs = Date.now() - published;
      const count = n + providers - 1 - tokens0;
      const per = (p: PartName): number => (count > 0 ? Math.round(((cpuMicros(part(p).pid) - (r0.get(p) ?? 0)) / 1000 / count) * 1000) / 1000 : 0);
      renewals = { count, linkCpuMsPer: per('link'), applyCpuMsPer: per('apply') };
      log(`  every token after ${allTokensMs} ms (${count} renewals since in force: link ${renewals.linkCpuMsPer} ms, apply ${renewals.applyCpuMsPer} ms of CPU each)`);
    } catch {
      log(`  ${tokens()}/${n + providers} tokens after ${o.tokensTimeoutMs / 1000} s; idle measured while renewing`);
    }
    const burstPeakRssMiB = Object.fromEntries(PART_NAMES.map((p) => [p, Math.round((peakRssBytes(part(p).pid) / MiB) * 10) / 10])) as Record<PartName, number>;
    log(`  peak RSS MiB until every token: ${PART_NAMES.map((p) => burstPeakRssMiB[p]).join(' / ')}`);
    // The last tokens' hand-off settled (apply's inbox, presence's report of the change).
    await sleep(o.idleAfterMs);
    const idleLoad = Math.round((loadavg()[0] ?? 0) * 100) / 100;
    const c0 = new Map(PART_NAMES.map((p) => [p, cpuMicros(part(p).pid)]));
    const t0 = performance.now();
    await sleep(o.idleMs);
    const elapsed = performance.now() - t0;
    const cpuPercent = Object.fromEntries(PART_NAMES.map((p) => [p, Math.round(((cpuMicros(part(p).pid) - (c0.get(p) ?? 0)) / 1000 / elapsed) * 10_000) / 100])) as Record<PartName, number>;
    const rssMiB = Object.fromEntries(PART_NAMES.map((p) => [p, Math.round((rssBytes(part(p).pid) / MiB) * 10) / 10])) as Record<PartName, number>;
    log(`  idle ${Math.round(elapsed / 1000)} s (load ${idleLoad}): CPU % ${PART_NAMES.map((p) => cpuPercent[p]).join(' / ')}; RSS MiB ${PART_NAMES.map((p) => rssMiB[p]).join(' / ')}`);
    const quiet = await disconnectOne();
    return {
      bindings: n,
      providers,
      loadavg1,
      handedOverMs: handedOver - published,
      appliedMs: appliedAt - published,
      shimsMs: shims - published,
      registryLoadedMs: registry - published,
      catalogLoadedMs: cat - published,
      sampleServedMs: served - published,
      inForceMs: inForce - published,
      allTokensMs,
      cpuToInForceMs,
      ...(busy && quiet ? { disconnect: { busy, quiet } } : {}),
      idle: { seconds: Math.round(elapsed / 100) / 10, renewing: allTokensMs === null, loadavg1: idleLoad, cpuPercent, rssMiB },
      renewals,
      burstPeakRssMiB,
    };
  } finally {
    for (const p of [...parts.values()].reverse()) await p.stop();
    await gw.close();
    await upstream.close();
    if (o.keep) log(`  kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

export async function runScaleBench(log: (line: string) => void, options: ScaleOptions = {}): Promise<{ machine: Record<string, string | number>; runs: ScaleRun[] }> {
  const o = {
    cli: options.cli ?? DEFAULT_CLI,
    idleMs: options.idleMs ?? 10_000,
    idleAfterMs: options.idleAfterMs ?? 5_000,
    tokensTimeoutMs: options.tokensTimeoutMs ?? 240_000,
    renewConcurrency: options.renewConcurrency ?? 8,
    nodeFlags: options.nodeFlags,
    keep: options.keep,
  };
  const host = machine();
  const runs: ScaleRun[] = [];
  for (const n of options.sizes ?? [10, 100, 1_000, 10_000]) runs.push(await oneSize(n, o, log));
  return { machine: host, runs };
}

/** The growth table of docs/scale.md. */
export function scaleMarkdown(runs: readonly ScaleRun[]): string {
  const parts = PART_NAMES.join(' / ');
  return [
    `| bindings (providers) | load | handed over | applied | registry loaded | sample served | shims | **in force** | every token | idle RSS MiB (${parts}) | idle CPU % (${parts}) | one disconnect → 404, busy / quiet (apply CPU ms) |`,
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...runs.map((r) =>
      [
        `${r.bindings} (${r.providers})`,
        r.loadavg1,
        ms(r.handedOverMs),
        ms(r.appliedMs),
        ms(r.registryLoadedMs),
        ms(r.sampleServedMs),
        ms(r.shimsMs),
        `**${ms(r.inForceMs)}**`,
        r.allTokensMs === null ? 'not within the wait' : ms(r.allTokensMs),
        PART_NAMES.map((p) => r.idle.rssMiB[p]).join(' / '),
        `${PART_NAMES.map((p) => r.idle.cpuPercent[p]).join(' / ')}${r.idle.renewing ? ' (renewing)' : ''}`,
        r.disconnect ? `${ms(r.disconnect.busy.to404Ms)} / ${ms(r.disconnect.quiet.to404Ms)} (${r.disconnect.busy.cpuMs.apply} / ${r.disconnect.quiet.cpuMs.apply})` : '',
      ].join(' | '),
    ).map((row) => `| ${row} |`),
  ].join('\n');
}

function ms(x: number): string {
  return x >= 1000 ? `${(x / 1000).toFixed(1)} s` : `${Math.round(x)} ms`;
}

export interface ScaleSeries {
  label: string;
  runs: readonly ScaleRun[];
}

/**
 * The growth plot: published → in force (left, log scale) and the largest part's idle RSS
 * (right panel), against bindings (log scale), one line per series (before / after).
 */
export function renderScaleSvg(series: readonly ScaleSeries[]): string {
  const W = 860;
  const H = 660;
  /** A log-log panel with its bound as a dashed line; `y0` its row (two rows of two). */
  const panel = (x0: number, y0: number, title: string, unit: string, value: (r: ScaleRun) => number | undefined, bound: number): string => {
    const pw = 360;
    const ph = 230;
    const top = y0 + 50;
    const at = (r: ScaleRun): number | undefined => {
      const v = value(r);
      return v !== undefined && v > 0 ? v : undefined;
    };
    const all = series.flatMap((s) => s.runs.map(at)).filter((v): v is number => v !== undefined);
    const lo = Math.pow(10, Math.floor(Math.log10(Math.min(bound, ...all))));
    const hi = Math.pow(10, Math.ceil(Math.log10(Math.max(bound, ...all))));
    const xs = (n: number): number => x0 + ((Math.log10(n) - 1) / 3) * pw;
    const ys = (v: number): number => top + ph - ((Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * ph;
    // Decades as written, not as the float products of 0.01 × 10 × …
    const tick = (d: number): string => String(Number(d.toPrecision(1)));
    const out: string[] = [`<text x="${x0 + pw / 2}" y="${y0 + 30}" text-anchor="middle" font-weight="bold">${title}</text>`];
    for (let e = Math.log10(lo); e <= Math.log10(hi) + 1e-9; e += 1) {
      const d = Math.pow(10, Math.round(e));
      out.push(`<line x1="${x0}" x2="${x0 + pw}" y1="${ys(d)}" y2="${ys(d)}" stroke="#ddd"/><text x="${x0 - 6}" y="${ys(d) + 4}" text-anchor="end">${tick(d)} ${unit}</text>`);
    }
    for (const n of [10, 100, 1000, 10000]) out.push(`<line x1="${xs(n)}" x2="${xs(n)}" y1="${top}" y2="${top + ph}" stroke="#eee"/><text x="${xs(n)}" y="${top + ph + 18}" text-anchor="middle">${n}</text>`);
    out.push(`<line x1="${x0}" x2="${x0 + pw}" y1="${ys(bound)}" y2="${ys(bound)}" stroke="#c00" stroke-dasharray="6 4"/><text x="${x0 + pw}" y="${ys(bound) - 5}" text-anchor="end" fill="#c00">bound ${bound} ${unit}</text>`);
    const colours = ['#888', '#06c', '#090', '#c60'];
    series.forEach((s, i) => {
      const pts = s.runs.flatMap((r) => {
        const v = at(r);
        return v === undefined ? [] : [`${xs(r.bindings).toFixed(1)},${ys(v).toFixed(1)}`];
      });
      out.push(`<polyline fill="none" stroke="${colours[i % colours.length]}" stroke-width="2" points="${pts.join(' ')}"/>`);
      for (const p of pts) out.push(`<circle cx="${p.split(',')[0]}" cy="${p.split(',')[1]}" r="3" fill="${colours[i % colours.length]}"/>`);
      out.push(`<text x="${x0 + 10}" y="${top + 16 + i * 16}" fill="${colours[i % colours.length]}">${s.label}</text>`);
    });
    out.push(`<text x="${x0 + pw / 2}" y="${top + ph + 38}" text-anchor="middle">bindings (providers: bindings / 10)</text>`);
    return out.join('\n');
  };
  const largest = (byPart: Record<PartName, number>): number => Math.max(...Object.values(byPart));
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    '<rect width="100%" height="100%" fill="white"/>',
    panel(70, 0, 'published → in force', 'ms', (r) => r.inForceMs, 2000),
    panel(480, 0, 'published → every token held', 'ms', (r) => r.allTokensMs ?? undefined, 20000),
    panel(70, 320, 'idle RSS, largest part', 'MiB', (r) => largest(r.idle.rssMiB), 150),
    // A run whose window still had renewals running is not idle: left out.
    panel(480, 320, 'idle CPU, busiest part', '% of a core', (r) => (r.idle.renewing ? undefined : largest(r.idle.cpuPercent)), 1),
    '</svg>',
    '',
  ].join('\n');
}

export async function runScale(log: (line: string) => void, argv: readonly string[], cli?: string): Promise<number> {
  const sizesArg = argv.find((a) => a.startsWith('--sizes='));
  const sizes = sizesArg ? sizesArg.slice('--sizes='.length).split(',').map(Number) : undefined;
  const wait = argv.find((a) => a.startsWith('--tokens-wait='));
  const prof = argv.find((a) => a.startsWith('--cpu-prof='));
  const idle = argv.find((a) => a.startsWith('--idle='));
  const conc = argv.find((a) => a.startsWith('--renew-concurrency='));
  const idleAfter = argv.find((a) => a.startsWith('--idle-after='));
  const res = await runScaleBench(log, {
    ...(cli === undefined ? {} : { cli }),
    ...(sizes ? { sizes } : {}),
    ...(wait ? { tokensTimeoutMs: Number(wait.slice('--tokens-wait='.length)) * 1000 } : {}),
    // `--idle=90`: the idle window, s (every token held: long-lived tokens, so no renewal falls in it).
    ...(idle ? { idleMs: Number(idle.slice('--idle='.length)) * 1000 } : {}),
    ...(idleAfter ? { idleAfterMs: Number(idleAfter.slice('--idle-after='.length)) * 1000 } : {}),
    ...(conc ? { renewConcurrency: Number(conc.slice('--renew-concurrency='.length)) } : {}),
    // `--cpu-prof=apply,forwarder`: those parts run with node's --cpu-prof; the profiles stay in the kept scratch directory.
    ...(prof ? { nodeFlags: Object.fromEntries(prof.slice('--cpu-prof='.length).split(',').map((p) => [p, ['--cpu-prof']])) } : {}),
    keep: argv.includes('--keep') || prof !== undefined,
  });
  // stdout is the JSON alone (what --scale-plot reads); the table goes with the log.
  process.stdout.write(`${JSON.stringify(res, null, 2)}\n`);
  log(scaleMarkdown(res.runs));
  return 0;
}

/** `--scale-plot before.json after.json`: each a `--scale` result (its JSON), labelled by its file name. */
export async function runScalePlot(files: readonly string[]): Promise<number> {
  const series = files
    .filter((f) => f.endsWith('.json'))
    .map((f) => ({ label: f.replace(/^.*\//, '').replace(/\.json$/, ''), runs: (JSON.parse(readFileSync(f, 'utf8')) as { runs: ScaleRun[] }).runs }));
  process.stdout.write(renderScaleSvg(series));
  return 0;
}
