/**
 * `npm run bench -- --renew-scale`: renewal of a large host's new slots end to end, and
 * disconnects while it runs (issue 23 item 2, docs/host-link.md "Renewal at scale").
 *
 * Real CLI processes on one scratch state root (`link`, `renew apply --watch`, `forwarder`)
 * against the mock host Gateway in this process (a real RenewAuthority and HostControl on
 * loopback). Two phases, each on a fresh host:
 *
 * 1. A desired state of N bindings (10 000) published at once. From the state in force
 *    (applied-state.json) to every binding holding a token file: slots/s and the time to
 *    all tokens; the CPU (utime+stime) and peak RSS of the link and apply over the burst.
 *    While the burst runs, probe bindings (connected and served before it) are disconnected
 *    one after the other: each from the Gateway's change to the forwarder answering 404
 *    (only samples that ended while tokens were still missing count as "during the burst").
 * 2. The Gateway revokes the whole host (its credential answers 401) while the renewals of a
 *    smaller state are in flight: to the forwarder answering 404 for a served binding, and
 *    to no token file left.
 *
 * Not a test: it asserts nothing about time, it prints figures.
 */
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, watch, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { CLK_TCK, cpuMicros, freePort, partNodeFlags, sleep, spawnTracked, stopChild, waitForJsonLine, waitForPort } from './lib/proc.js';
import { appliedVersion, okUpstream, peakRssBytes, spread as spreadOf, status, until, type Spread } from './link.js';

const peakRssMiB = (pid: number): number => Math.round(peakRssBytes(pid) / MiB);

/** utime and stime (µs) apart: how much of a part's CPU is its system calls. */
function userSystemMicros(pid: number): { user: number; system: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: (Number(fields[11]) * 1e6) / CLK_TCK, system: (Number(fields[12]) * 1e6) / CLK_TCK };
}

const HOST_ID = 'bench-host';
const MiB = 1024 * 1024;

export interface RenewScaleOptions {
  cli?: string;
  /** Bindings in the large state, probes included (default 10 000, the bound of a state). */
  bindings?: number;
  /** Bindings disconnected one by one during the burst (default 25). */
  probes?: number;
  /** Bindings of phase 2's state (default 3 000) and the tokens written before the revocation (default 300). */
  revokeBindings?: number;
  revokeAfterTokens?: number;
  /** The link's `--renew-concurrency` (default: the link's own). */
  renewConcurrency?: number;
  /** Run the link under `node --cpu-prof`, its profiles written here (at its exit). */
  linkCpuProfDir?: string;
  /** The same for `renew apply --watch`. */
  applyCpuProfDir?: string;
  /** Skip phase 2 (the revocation): quicker iteration on phase 1's figures. */
  noRevoke?: boolean;
}

const spread = (values: number[]): Spread => spreadOf(values, Math.round);

/**
 * The token files of a directory, counted by prefix without listing it: an inotify watch
 * (`fs.watch`) names each file renamed in or removed, and one stat per event says which.
 * Listing 10 000 files every 50 ms cost this process about as much CPU as the link's
 * whole renewal work, on the same two cores it measures. A full listing every
 * `relistMs`, and after an unnamed event or a watch error, is the safety net for a
 * dropped event.
 */
class TokenCounter {
  readonly #names = new Set<string>();
  readonly #counts = new Map<string, number>();
  readonly #watcher;
  readonly #timer;

  constructor(
    private readonly dir: string,
    relistMs = 5_000,
  ) {
    this.#watcher = watch(dir, { persistent: false, encoding: 'utf8' }, (_event, name) => {
      if (name === null) this.#relist();
      else this.#look(name);
    });
    this.#watcher.on('error', () => this.#relist());
    this.#relist();
    this.#timer = setInterval(() => this.#relist(), relistMs);
    this.#timer.unref();
  }

  /** Token files whose name starts with `prefix`. */
  count(prefix: string): number {
    let n = this.#counts.get(prefix);
    if (n === undefined) {
      n = 0;
      for (const name of this.#names) if (name.startsWith(prefix)) n += 1;
      this.#counts.set(prefix, n);
    }
    return n;
  }

  close(): void {
    clearInterval(this.#timer);
    this.#watcher.close();
  }

  #isToken(name: string): boolean {
    return !name.startsWith('.') && name.endsWith('.token');
  }

  #look(name: string): void {
    if (!this.#isToken(name)) return;
    if (existsSync(join(this.dir, name))) this.#add(name);
    else this.#delete(name);
  }

  #add(name: string): void {
    if (this.#names.has(name)) return;
    this.#names.add(name);
    for (const [prefix, n] of this.#counts) if (name.startsWith(prefix)) this.#counts.set(prefix, n + 1);
  }

  #delete(name: string): void {
    if (!this.#names.delete(name)) return;
    for (const [prefix, n] of this.#counts) if (name.startsWith(prefix)) this.#counts.set(prefix, n - 1);
  }

  #relist(): void {
    let listed: string[];
    try {
      listed = readdirSync(this.dir).filter((n) => this.#isToken(n));
    } catch {
      return;
    }
    this.#names.clear();
    for (const n of listed) this.#names.add(n);
    this.#counts.clear();
  }
}


interface Host {
  gw: MockHostGateway;
  state: string;
  handoff: string;
  fwdPort: number;
  link: number;
  apply: number;
  applied: string;
  /** Token files by prefix (counted from file events: TokenCounter). */
  tokens: (prefix: string) => number;
  bindingUrl: (id: string) => string;
  close: () => Promise<void>;
}

/** A fresh host: the three parts on one scratch state root, the first (empty) state applied. */
async function startHost(cli: string, upstreamUrl: string, renewConcurrency: number | undefined, linkCpuProfDir?: string, applyCpuProfDir?: string): Promise<Host> {
  const dir = mkdtempSync(join(tmpdir(), 'ac-bench-renew-scale-'));
  const state = join(dir, 'state');
  const handoff = join(state, 'handoff');
  for (const d of [join(handoff, 'inbox'), join(handoff, 'slots')]) mkdirSync(d, { recursive: true });
  for (const d of ['mcp-forwarder', 'cli-proxy']) mkdirSync(join(state, d), { recursive: true, mode: 0o700 });
  const credential = `hostcred-bench-${Math.random().toString(36).slice(2)}${Date.now()}`;
  const credentialFile = join(dir, 'host-credential');
  writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
  const gw = await MockHostGateway.start({ staticHosts: { [HOST_ID]: credential }, tokenLifetimeMs: 6 * 3600_000 });
  const stops: Array<() => Promise<void>> = [];
  const start = (name: string, args: string[], level = 'warn', nodeFlags: string[] = []): { pid: number; log: string } => {
    const log = join(dir, `${name}.log`);
    const out = openSync(log, 'a');
    const env = { ...process.env };
    delete env.NOTIFY_SOCKET;
    delete env.WATCHDOG_USEC;
    const child = spawnTracked(process.execPath, [...nodeFlags, cli, ...args, '--log-level', level], { stdio: ['ignore', out, out], env, cwd: dir });
    closeSync(out);
    stops.push(() => stopChild(child, 'SIGTERM'));
    return { pid: child.pid as number, log };
  };
  let counter: TokenCounter | undefined;
  const close = async (): Promise<void> => {
    counter?.close();
    for (const s of stops.reverse()) await s();
    await gw.close();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const fwdPort = await freePort();
    // Each part with the node flags its unit runs it with (this build's).
    start('forwarder', ['forwarder', '--state-dir', state, '--listen', `127.0.0.1:${fwdPort}`], 'warn', await partNodeFlags(cli, 'forwarder'));
    await waitForPort(fwdPort, 30_000);
    const apply = start('apply', ['renew', 'apply', '--watch', '--state-dir', state, '--handoff', handoff, '--shim-dir', join(dir, 'shims')], 'info', [...(await partNodeFlags(cli, 'apply')), ...(applyCpuProfDir === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${applyCpuProfDir}`])]);
    await waitForJsonLine(apply.log, (l) => l.msg === 'apply watching', 30_000);
    // prettier-ignore
    const link = start('link', [
      'link', '--gateway', gw.url, '--credential', credentialFile, '--handoff', handoff, '--state-dir', state, '--host-id', HOST_ID,
      ...(renewConcurrency === undefined ? [] : ['--renew-concurrency', String(renewConcurrency)]),
    ], 'warn', [...(await partNodeFlags(cli, 'link')), ...(linkCpuProfDir === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${linkCpuProfDir}`])]);
    const applied = join(handoff, 'applied-state.json');
    await until(() => appliedVersion(applied) === gw.control.version, performance.now(), 'the first state applied', 60_000, 20);
    const tokenCounter = new TokenCounter(join(state, 'mcp-forwarder'));
    counter = tokenCounter;
    const tokens = (prefix: string): number => tokenCounter.count(prefix);
    const bindingUrl = (id: string): string => `http://127.0.0.1:${fwdPort}/i/${id}/mcp`;
    return { gw, state, handoff, fwdPort, link: link.pid, apply: apply.pid, applied, tokens, bindingUrl, close };
  } catch (err) {
    await close();
    throw err;
  }
}

const bindingsOf = (prefix: string, n: number, upstream: string): Record<string, { instanceId: string; upstreamUrl: string }> =>
  Object.fromEntries(Array.from({ length: n }, (_, i) => [`bind_${prefix}_${String(i).padStart(6, '0')}`, { instanceId: `${prefix}-${i}`, upstreamUrl: `${upstream}/mcp/${prefix}/${i}` }]));

/** Connects bindings in one version and waits until each answers 200 through the forwarder. */
async function connectServed(host: Host, bindings: Record<string, { instanceId: string; upstreamUrl: string }>): Promise<void> {
  host.gw.control.connectBindings(bindings);
  const t0 = performance.now();
  for (const id of Object.keys(bindings)) await until(async () => (await status(host.bindingUrl(id))) === 200, t0, `${id} served`, 120_000, 20);
}

async function burstPhase(
  cli: string,
  upstream: string,
  log: (l: string) => void,
  o: Required<Omit<RenewScaleOptions, 'cli' | 'renewConcurrency' | 'linkCpuProfDir' | 'applyCpuProfDir' | 'noRevoke'>> & { renewConcurrency?: number; linkCpuProfDir?: string; applyCpuProfDir?: string },
): Promise<Record<string, unknown>> {
  const host = await startHost(cli, upstream, o.renewConcurrency, o.linkCpuProfDir, o.applyCpuProfDir);
  try {
    const probes = bindingsOf('probe', o.probes, upstream);
    await connectServed(host, probes);
    const many = o.bindings - o.probes;
    log(`renew scale: ${o.probes} probes served; publishing ${many} bindings`);
    const load0 = loadavg()[0] ?? NaN;
    const cpu0 = { link: cpuMicros(host.link), apply: cpuMicros(host.apply), bench: process.cpuUsage(), linkSplit: userSystemMicros(host.link), applySplit: userSystemMicros(host.apply) };
    const t0 = performance.now();
    host.gw.control.connectBindings(bindingsOf('many', many, upstream));
    const version = host.gw.control.version;
    const inForceMs = await until(() => appliedVersion(host.applied) >= version, t0, 'the large state applied', 900_000, 10);
    const tokensAtInForce = host.tokens('many-');
    log(`renew scale: in force after ${Math.round(inForceMs)} ms (${tokensAtInForce} tokens already); disconnecting probes`);
    let allMs: number | undefined;
    const progress: Array<{ s: number; tokens: number }> = [];
    const watcher = (async () => {
      let last = 0;
      for (;;) {
        const n = host.tokens('many-');
        const now = performance.now() - t0;
        if (now - last >= 10_000) {
          progress.push({ s: Math.round(now / 100) / 10, tokens: n });
          last = now;
        }
        if (n >= many) {
          allMs = now;
          return;
        }
        if (now > 1_800_000) return;
        await sleep(50);
      }
    })();
    const during: number[] = [];
    const after: number[] = [];
    for (const [id, b] of Object.entries(probes)) {
      const tokenFile = join(host.state, 'mcp-forwarder', `${b.instanceId}.token`);
      const t = performance.now();
      host.gw.control.disconnectBinding(id);
      const ms = await until(async () => (await status(host.bindingUrl(id))) === 404, t, `${id} answered 404`, 120_000, 5);
      await until(() => !existsSync(tokenFile), t, `${id}'s token deleted`, 120_000, 5);
      (allMs === undefined ? during : after).push(ms);
    }
    await watcher;
    const cpu1 = { link: cpuMicros(host.link), apply: cpuMicros(host.apply), bench: process.cpuUsage(cpu0.bench), linkSplit: userSystemMicros(host.link), applySplit: userSystemMicros(host.apply) };
    const renewMs = allMs === undefined ? undefined : allMs - inForceMs;
    return {
      loadavg1: { start: Math.round(load0 * 10) / 10, end: Math.round((loadavg()[0] ?? NaN) * 10) / 10 },
      bindings: many,
      inForceMs: Math.round(inForceMs),
      tokensAtInForce,
      allTokensAfterPublishMs: allMs === undefined ? null : Math.round(allMs),
      allTokensAfterInForceMs: renewMs === undefined ? null : Math.round(renewMs),
      slotsPerSecondAfterInForce: renewMs === undefined ? null : Math.round(((many - tokensAtInForce) / renewMs) * 1000),
      cpuSecondsUntilAllTokens: {
        link: Math.round((cpu1.link - cpu0.link) / 1e5) / 10,
        linkUser: Math.round((cpu1.linkSplit.user - cpu0.linkSplit.user) / 1e5) / 10,
        linkSystem: Math.round((cpu1.linkSplit.system - cpu0.linkSplit.system) / 1e5) / 10,
        apply: Math.round((cpu1.apply - cpu0.apply) / 1e5) / 10,
        applyUser: Math.round((cpu1.applySplit.user - cpu0.applySplit.user) / 1e5) / 10,
        applySystem: Math.round((cpu1.applySplit.system - cpu0.applySplit.system) / 1e5) / 10,
        // This process: the mock Gateway's renewals, plus the bench's own watching (the token
        // directory's file events, a listing every 5 s, and the probes' requests).
        benchWithMockGateway: Math.round((cpu1.bench.user + cpu1.bench.system) / 1e5) / 10,
      },
      // Per slot of the burst (the probes' disconnects are in the totals too; 25 against thousands).
      cpuMsPerSlot: {
        link: Math.round((cpu1.link - cpu0.link) / many) / 1000,
        linkUser: Math.round((cpu1.linkSplit.user - cpu0.linkSplit.user) / many) / 1000,
        linkSystem: Math.round((cpu1.linkSplit.system - cpu0.linkSplit.system) / many) / 1000,
        apply: Math.round((cpu1.apply - cpu0.apply) / many) / 1000,
        applyUser: Math.round((cpu1.applySplit.user - cpu0.applySplit.user) / many) / 1000,
        applySystem: Math.round((cpu1.applySplit.system - cpu0.applySplit.system) / many) / 1000,
      },
      peakRssMiB: { link: peakRssMiB(host.link), apply: peakRssMiB(host.apply) },
      disconnectTo404DuringBurstMs: spread(during),
      disconnectTo404AfterBurstMs: spread(after),
      progress,
      gateway: host.gw.control.stats(),
    };
  } finally {
    await host.close();
  }
}

async function revokePhase(cli: string, upstream: string, log: (l: string) => void, o: { revokeBindings: number; revokeAfterTokens: number; renewConcurrency?: number }): Promise<Record<string, unknown>> {
  const host = await startHost(cli, upstream, o.renewConcurrency);
  try {
    const keeper = bindingsOf('keep', 1, upstream);
    await connectServed(host, keeper);
    host.gw.control.connectBindings(bindingsOf('rv', o.revokeBindings, upstream));
    const version = host.gw.control.version;
    const t0 = performance.now();
    await until(() => appliedVersion(host.applied) >= version && host.tokens('rv-') >= o.revokeAfterTokens, t0, 'the burst under way', 900_000, 10);
    const tokensAtRevoke = host.tokens('rv-');
    log(`renew scale: revoking the host with ${tokensAtRevoke}/${o.revokeBindings} tokens written`);
    const load = loadavg()[0] ?? NaN;
    const t = performance.now();
    host.gw.control.revokeHost(HOST_ID);
    const [to404, toNoToken] = await Promise.all([
      until(async () => (await status(host.bindingUrl(Object.keys(keeper)[0] as string))) === 404, t, 'the keeper answered 404', 120_000, 5),
      until(() => host.tokens('') === 0, t, 'no token file left', 120_000, 5),
    ]);
    // Renewals in flight when the revocation came must not leave a token behind (a listing:
    // the directory itself, not the counter, says what is left).
    await sleep(2_000);
    const left = readdirSync(join(host.state, 'mcp-forwarder')).filter((f) => f.endsWith('.token')).length;
    return { loadavg1: Math.round(load * 10) / 10, bindings: o.revokeBindings, tokensAtRevoke, revokeTo404Ms: Math.round(to404), revokeToNoTokenMs: Math.round(toNoToken), tokenFilesLeft2sLater: left };
  } finally {
    await host.close();
  }
}

export async function runRenewScale(log: (line: string) => void, options: RenewScaleOptions = {}): Promise<Record<string, unknown>> {
  const cli = options.cli ?? DEFAULT_CLI;
  const o = {
    bindings: options.bindings ?? 10_000,
    probes: options.probes ?? 25,
    revokeBindings: options.revokeBindings ?? 3_000,
    revokeAfterTokens: options.revokeAfterTokens ?? 300,
    ...(options.renewConcurrency !== undefined && { renewConcurrency: options.renewConcurrency }),
    ...(options.linkCpuProfDir !== undefined && { linkCpuProfDir: options.linkCpuProfDir }),
    ...(options.applyCpuProfDir !== undefined && { applyCpuProfDir: options.applyCpuProfDir }),
  };
  const upstream = await okUpstream();
  try {
    const burst = await burstPhase(cli, upstream.url, log, o);
    log(`renew scale: ${JSON.stringify(burst)}`);
    if (options.noRevoke) return { burst };
    const revoke = await revokePhase(cli, upstream.url, log, o);
    return { burst, revoke };
  } finally {
    await upstream.close();
  }
}

function numberFlag(argv: string[], name: string): number | undefined {
  const i = argv.indexOf(name);
  return i === -1 ? undefined : Number(argv[i + 1]);
}

export async function runRenewScaleCli(argv: string[], log: (line: string) => void): Promise<number> {
  const bindings = numberFlag(argv, '--bindings');
  const probes = numberFlag(argv, '--probes');
  const renewConcurrency = numberFlag(argv, '--renew-concurrency');
  const prof = argv.indexOf('--link-cpu-prof');
  const linkCpuProfDir = prof === -1 ? undefined : argv[prof + 1];
  const aprof = argv.indexOf('--apply-cpu-prof');
  const applyCpuProfDir = aprof === -1 ? undefined : argv[aprof + 1];
  const res = await runRenewScale(log, {
    ...(applyCpuProfDir !== undefined && { applyCpuProfDir }),
    ...(linkCpuProfDir !== undefined && { linkCpuProfDir }),
    ...(argv.includes('--no-revoke') && { noRevoke: true }),
    ...(bindings !== undefined && { bindings }),
    ...(probes !== undefined && { probes }),
    ...(renewConcurrency !== undefined && { renewConcurrency }),
  });
  process.stdout.write(`${JSON.stringify(res, null, 2)}\n`);
  return 0;
}
