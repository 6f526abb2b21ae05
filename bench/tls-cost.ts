/**
 * `npm run bench -- --tls`: what a call costs through TLS mode (SPEC §10, issue 20 item 7)
 * against base-url mode, with direct calls to the same https upstream as the floor.
 * Serial Node clients (undici; `ProxyAgent` for CONNECT), every case in every round, the
 * order rotated. Per case: the cli-proxy's CPU per call (its /proc CPU time over the
 * batch / calls) and the latency p50/p99, and the upstream TLS handshakes per call (does
 * the proxy reuse its upstream connections?). Then the leaf minting alone, in process.
 * docs/design/tls-mode.md has the method and the figures.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { createSecureContext } from 'node:tls';
import { join } from 'node:path';
import { Client, ProxyAgent, request, type Dispatcher } from 'undici';
import { createCa, issueLeaf, loadCa } from '../src/cli-proxy/certificates.js';
import { systemCaText } from '../src/cli-proxy/cli-ca.js';
import { LeafCache } from '../src/cli-proxy/leaf-cache.js';
import { CA_CERT_FILE } from '../src/data/state-layout.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { BENCH_TOKEN, newWorkDir, removeWorkDir, startNode, type ProcPeer } from './lib/peers.js';
import { cpuMicros } from './lib/proc.js';
import { median, percentile } from './lib/stats.js';
import { BENCH_DOMAIN, makeLabPki, startLabUpstream } from './lib/tls-lab.js';
import { JSON_REQUEST, JSON_RESPONSE } from './lib/wire.js';

export const TLS_CASES = ['direct keep-alive', 'direct new conn', 'base-url keep-alive', 'base-url new conn', 'tls keep-alive', 'tls new CONNECT', 'tls first call'] as const;
export type TlsCase = (typeof TLS_CASES)[number];

/** What each case's added latency is measured against: the same connection habit, direct. */
const FLOOR: Record<TlsCase, TlsCase | undefined> = {
  'direct keep-alive': undefined,
  'direct new conn': undefined,
  'base-url keep-alive': 'direct keep-alive',
  'base-url new conn': 'direct new conn',
  'tls keep-alive': 'direct keep-alive',
  'tls new CONNECT': 'direct new conn',
  'tls first call': 'direct new conn',
};

export interface TlsCostOptions {
  rounds: number;
  /** Calls per case and round: keep-alive cases, new-connection cases, first calls (a new host each). */
  keepAliveCalls: number;
  newCalls: number;
  firstCalls: number;
  /** Leaves minted in process for the minting figure. */
  mints: number;
  cli: string;
}

export const DEFAULT_TLS_COST: TlsCostOptions = { rounds: 5, keepAliveCalls: 200, newCalls: 40, firstCalls: 12, mints: 40, cli: DEFAULT_CLI };

export interface TlsCaseFigure {
  case: TlsCase;
  calls: number;
  /** cli-proxy CPU per call, ms: the median of the rounds' (batch CPU / calls). */
  cpuMsPerCall: number;
  cpuMsMin: number;
  cpuMsMax: number;
  p50Ms: number;
  p99Ms: number;
  /** p50 / p99 over the floor's (the direct case with the same connection habit). */
  addedP50Ms: number | undefined;
  addedP99Ms: number | undefined;
  /** TLS handshakes the upstream did per call (0: the proxy's upstream connection was reused). */
  upstreamHandshakesPerCall: number;
}

export interface MintFigure {
  /** The CA, once (key pair, self-signed certificate). */
  caCpuMs: number;
  /** One leaf: key pair and signature (issueLeaf), CPU ms, median of `mints`. */
  leafCpuMs: number;
  /** A new host through the cache: leaf + TLS server context, CPU ms per host. */
  cacheMissCpuMs: number;
  /** A cached host: µs CPU per lookup. */
  cacheHitCpuUs: number;
  mints: number;
  /**
   * The upstream trust list (the system's CAs) parsed into a TLS context, CPU ms: what
   * every new upstream connection paid while the list was given to the connector as `ca`.
   */
  trustContextCpuMs: number;
  trustCertificates: number;
}

export interface TlsCostResult {
  loadavgStart: number[];
  loadavgEnd: number[];
  rounds: number;
  cases: TlsCaseFigure[];
  mint: MintFigure;
}

const cpuNow = (): number => {
  const u = process.cpuUsage();
  return u.user + u.system;
};

/** Leaf minting alone, in this process: what a first call to a new host adds, and what the cache saves. */
export async function measureMinting(mints: number): Promise<MintFigure> {
  let c0 = cpuNow();
  const issued = await createCa('tls bench CA', 30);
  const caCpuMs = (cpuNow() - c0) / 1000;
  const ca = await loadCa(issued.cert, issued.key);
  for (let i = 0; i < 3; i++) await issueLeaf(ca, `warm${i}.${BENCH_DOMAIN}`, 3_600_000); // JIT, WebCrypto init
  const leaf: number[] = [];
  for (let i = 0; i < mints; i++) {
    c0 = cpuNow();
    await issueLeaf(ca, `m${i}.${BENCH_DOMAIN}`, 3_600_000);
    leaf.push((cpuNow() - c0) / 1000);
  }
  const cache = new LeafCache(ca);
  const miss: number[] = [];
  for (let i = 0; i < mints; i++) {
    c0 = cpuNow();
    await cache.context(`c${i}.${BENCH_DOMAIN}`);
    miss.push((cpuNow() - c0) / 1000);
  }
  const hits = 20_000;
  c0 = cpuNow();
  for (let i = 0; i < hits; i++) await cache.context(`c${i % mints}.${BENCH_DOMAIN}`);
  const cacheHitCpuUs = (cpuNow() - c0) / hits;
  const trust = await systemCaText();
  const contexts: number[] = [];
  for (let i = 0; i < 10; i++) {
    c0 = cpuNow();
    createSecureContext({ ca: trust });
    contexts.push((cpuNow() - c0) / 1000);
  }
  const trustCertificates = trust.split('-----BEGIN CERTIFICATE-----').length - 1;
  return { caCpuMs, leafCpuMs: median(leaf), cacheMissCpuMs: median(miss), cacheHitCpuUs, mints, trustContextCpuMs: median(contexts), trustCertificates };
}

interface CallResult {
  ms: number;
  handshakes: number;
}

async function call(url: string, dispatcher: Dispatcher): Promise<CallResult> {
  const t0 = process.hrtime.bigint();
  const res = await request(url, { method: 'POST', dispatcher, headers: { 'content-type': 'application/json', authorization: 'Bearer placeholder' }, body: JSON_REQUEST });
  const body = Buffer.from(await res.body.arrayBuffer());
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (res.statusCode !== 200 || !body.equals(JSON_RESPONSE)) throw new Error(`${url}: ${res.statusCode} ${body.toString('utf8', 0, 200)}`);
  return { ms, handshakes: Number(String(res.headers['x-request-id']).replace('handshakes-', '')) };
}

interface Lab {
  upstreamPort: number;
  proxy: ProcPeer;
  /** The lab CA (the upstream's) and the cli-proxy's CLI CA certificate, PEM. */
  labCa: string;
  cliCa: string;
  nextHost: () => string;
}

/** One case's caller: `calls` serial calls, each as the case's client habit makes it. */
function caller(c: TlsCase, lab: Lab): (calls: number) => Promise<CallResult[]> {
  const direct = `https://127.0.0.1:${lab.upstreamPort}`;
  const viaProxy = `http://127.0.0.1:${lab.proxy.port}`;
  const directTls = { ca: lab.labCa, servername: `api.${BENCH_DOMAIN}` };
  const proxyTls = { ca: lab.cliCa };
  const path = '/v1/call';
  const serial = async (calls: number, one: () => Promise<CallResult>): Promise<CallResult[]> => {
    const out: CallResult[] = [];
    for (let i = 0; i < calls; i++) out.push(await one());
    return out;
  };
  /** A fresh dispatcher per call (a CLI process per call, as curl or gh): no connection or TLS session kept. */
  const fresh = (make: () => Dispatcher, url: () => string) => (calls: number) =>
    serial(calls, async () => {
      const d = make();
      try {
        return await call(url(), d);
      } finally {
        await d.close();
      }
    });
  /** One dispatcher for the batch (an SDK in a long-lived process): keep-alive. */
  const kept = (make: () => Dispatcher, url: string) => async (calls: number) => {
    const d = make();
    try {
      return await serial(calls, () => call(url, d));
    } finally {
      await d.close();
    }
  };
  switch (c) {
    case 'direct keep-alive':
      return kept(() => new Client(direct, { connect: directTls }), `${direct}${path}`);
    case 'direct new conn':
      return fresh(() => new Client(direct, { connect: directTls }), () => `${direct}${path}`);
    case 'base-url keep-alive':
      return kept(() => new Client(viaProxy), `${viaProxy}/p/base${path}`);
    case 'base-url new conn':
      return fresh(() => new Client(viaProxy), () => `${viaProxy}/p/base${path}`);
    case 'tls keep-alive':
      return kept(() => new ProxyAgent({ uri: viaProxy, requestTls: proxyTls }), `https://api.${BENCH_DOMAIN}${path}`);
    case 'tls new CONNECT':
      return fresh(() => new ProxyAgent({ uri: viaProxy, requestTls: proxyTls }), () => `https://api.${BENCH_DOMAIN}${path}`);
    case 'tls first call':
      return fresh(() => new ProxyAgent({ uri: viaProxy, requestTls: proxyTls }), () => `https://${lab.nextHost()}${path}`);
  }
}

function callsOf(c: TlsCase, o: TlsCostOptions): number {
  return c.endsWith('keep-alive') ? o.keepAliveCalls : c === 'tls first call' ? o.firstCalls : o.newCalls;
}

export async function runTlsCost(log: (line: string) => void, o: TlsCostOptions = DEFAULT_TLS_COST): Promise<TlsCostResult> {
  const loadavgStart = loadavg();
  log(`tls cost: load average ${loadavgStart.map((x) => x.toFixed(2)).join(' ')}`);
  const mint = await measureMinting(o.mints);
  log(`  minting: CA ${mint.caCpuMs.toFixed(1)} ms CPU once; leaf ${mint.leafCpuMs.toFixed(2)} ms; new host through the cache (leaf + TLS context) ${mint.cacheMissCpuMs.toFixed(2)} ms; cached host ${mint.cacheHitCpuUs.toFixed(2)} µs; trust list context ${mint.trustContextCpuMs.toFixed(2)} ms`);

  const work = newWorkDir();
  const pki = join(work, 'pki');
  mkdirSync(pki, { mode: 0o700 });
  const { ca, key, cert } = makeLabPki(pki);
  const upstream = await startLabUpstream(key, cert);
  // Every host a first call will use, plus the warm-up's: --resolve is per exact host.
  const hosts = [`api.${BENCH_DOMAIN}`, ...Array.from({ length: (o.rounds + 1) * o.firstCalls }, (_, i) => `h${i}.${BENCH_DOMAIN}`)];
  const state = join(work, 'state');
  const cdir = join(state, 'cli-proxy');
  mkdirSync(cdir, { recursive: true, mode: 0o700 });
  const tokenFile = join(cdir, 'bench.token');
  writeFileSync(tokenFile, `${BENCH_TOKEN}\n`, { mode: 0o600 });
  const inject = { type: 'header', name: 'Authorization', value: 'Bearer {token}' };
  const catalog = {
    base: { upstream: `https://127.0.0.1:${upstream.port}`, tokenFile, inject },
    tlsb: { mode: 'tls', hosts: [`*.${BENCH_DOMAIN}`], tokenFile, inject },
  };
  writeFileSync(join(cdir, 'providers.json'), JSON.stringify(catalog), { mode: 0o600 });
  const proxy = await startNode(
    { cli: o.cli },
    state,
    [
      'cli-proxy', '--state-dir', state, '--log-level', 'info',
      '--allowed-uids', String(process.getuid?.() ?? 0),
      '--ca-bundle', join(work, 'ca-bundle.pem'),
      '--upstream-ca', ca,
      ...hosts.flatMap((h) => ['--resolve', `${h}:443:127.0.0.1:${upstream.port}`]),
    ],
    // base-url mode's upstream agent trusts Node's list: the lab CA joins it here.
    { NODE_EXTRA_CA_CERTS: ca },
  );
  let next = 0;
  const lab: Lab = {
    upstreamPort: upstream.port,
    proxy,
    labCa: readFileSync(ca, 'utf8'),
    cliCa: readFileSync(join(state, 'cli-ca', CA_CERT_FILE), 'utf8'),
    nextHost: () => hosts[1 + next++] as string,
  };
  const pid = proxy.pids()[0] as number;
  const lat = new Map<TlsCase, number[]>(TLS_CASES.map((c) => [c, []]));
  const cpu = new Map<TlsCase, number[]>(TLS_CASES.map((c) => [c, []]));
  const hs = new Map<TlsCase, number[]>(TLS_CASES.map((c) => [c, []]));
  try {
    const callers = new Map(TLS_CASES.map((c) => [c, caller(c, lab)]));
    for (const c of TLS_CASES) await callers.get(c)!(Math.min(5, callsOf(c, o))); // warm-up: JIT, pools, the api host's leaf
    next = o.firstCalls; // the warm-up's first calls used hosts of their own
    for (let r = 0; r < o.rounds; r++) {
      const order = TLS_CASES.map((_, i) => TLS_CASES[(i + r) % TLS_CASES.length] as TlsCase);
      for (const c of order) {
        const n = callsOf(c, o);
        const c0 = cpuMicros(pid);
        const results = await callers.get(c)!(n);
        cpu.get(c)!.push((cpuMicros(pid) - c0) / 1000 / n);
        lat.get(c)!.push(...results.map((x) => x.ms));
        const first = results[0]?.handshakes ?? 0;
        const last = results[results.length - 1]?.handshakes ?? 0;
        // x-handshakes counts those before each answer; n-1 intervals between the first and last.
        hs.get(c)!.push(n > 1 ? (last - first) / (n - 1) : 0);
      }
      log(`  round ${r + 1}/${o.rounds} done (load ${loadavg()[0]?.toFixed(2)})`);
    }
  } finally {
    await proxy.stop();
    await upstream.stop();
    removeWorkDir(work);
  }
  const p = (c: TlsCase, q: number): number => percentile([...lat.get(c)!].sort((a, b) => a - b), q);
  const cases = TLS_CASES.map((c): TlsCaseFigure => {
    const floor = FLOOR[c];
    const isDirect = c.startsWith('direct');
    const cpus = cpu.get(c)!;
    return {
      case: c,
      calls: lat.get(c)!.length,
      cpuMsPerCall: isDirect ? 0 : median(cpus),
      cpuMsMin: isDirect ? 0 : Math.min(...cpus),
      cpuMsMax: isDirect ? 0 : Math.max(...cpus),
      p50Ms: p(c, 50),
      p99Ms: p(c, 99),
      addedP50Ms: floor && p(c, 50) - p(floor, 50),
      addedP99Ms: floor && p(c, 99) - p(floor, 99),
      upstreamHandshakesPerCall: median(hs.get(c)!),
    };
  });
  return { loadavgStart, loadavgEnd: loadavg(), rounds: o.rounds, cases, mint };
}

const f = (x: number | undefined, d = 2): string => (x === undefined ? '—' : x.toFixed(d));

/** The table docs/design/tls-mode.md shows. */
export function tlsCostMarkdown(r: TlsCostResult): string {
  const load = (l: number[]): string => l.map((x) => x.toFixed(1)).join(' / ');
  return [
    `Load average ${load(r.loadavgStart)} at the start, ${load(r.loadavgEnd)} at the end; ${r.rounds} rounds, cases interleaved.`,
    '',
    '| case | calls | cli-proxy CPU ms/call (min–max) | p50 ms | p99 ms | added p50 | added p99 | upstream handshakes/call |',
    '|---|---|---|---|---|---|---|---|',
    ...r.cases.map(
      (c) =>
        `| ${c.case} | ${c.calls} | ${c.case.startsWith('direct') ? '— (no proxy)' : `${f(c.cpuMsPerCall)} (${f(c.cpuMsMin)}–${f(c.cpuMsMax)})`} | ${f(c.p50Ms)} | ${f(c.p99Ms)} | ${f(c.addedP50Ms)} | ${f(c.addedP99Ms)} | ${f(c.upstreamHandshakesPerCall)} |`,
    ),
    '',
    `Minting alone (in process, median of ${r.mint.mints}): the CA ${f(r.mint.caCpuMs, 1)} ms CPU (once); a leaf ${f(r.mint.leafCpuMs)} ms; a new host through the leaf cache (leaf + TLS server context) ${f(r.mint.cacheMissCpuMs)} ms; a cached host ${f(r.mint.cacheHitCpuUs)} µs. The system's ${r.mint.trustCertificates} CA certificates parsed into a TLS context: ${f(r.mint.trustContextCpuMs)} ms (once per process now; before, once per new upstream connection).`,
  ].join('\n');
}
