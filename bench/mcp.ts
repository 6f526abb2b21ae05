/**
 * `npm run bench -- --mcp`: real MCP traffic (issue 23 item 1). The MCP SDK's client,
 * in this process, drives `tools/call` through each peer to the SDK's Streamable HTTP
 * server (bench/mcp-server.ts, its own process): initialize once per peer and answer
 * framing, then calls in a row and 8 at once, answers as SSE and as JSON. Peers: direct,
 * the Node floor (reading its token file per request), the forwarder, the cli-proxy, and
 * what a user would pick instead: mcp-remote over stdio with `--header`, and supergateway
 * (stateful Streamable HTTP) in front of it. One interleaved run: round → pattern →
 * framing → batches, the peer order rotated per batch, so load drift hits every peer
 * alike. CPU per call = the peer's processes' utime+stime delta (/proc, the whole process
 * tree for the mcp-remote chains) / calls; added latency = the peer's percentile − direct's
 * in the same round. docs/performance.md#real-mcp-calls has the method and the figures.
 */
import { closeSync, copyFileSync, mkdirSync, openSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import type { ChildProcess } from 'node:child_process';
import { loadavg } from 'node:os';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { optionReader } from './lib/args.js';
import type { AuditDrain } from './lib/audit-drain.js';
import { BENCH_BUILD_DIR, DEFAULT_CLI, DOCS_FILE, MCP_SERVER_JS, REPO_ROOT, RESULTS_DIR } from './lib/paths.js';
import { installedNpmPeers, installNpmPeers, NPM_PEERS, type NpmPeerBins } from './lib/npm-peers.js';
import { BENCH_TOKEN, newWorkDir, removeWorkDir, startPeer, type Peer } from './lib/peers.js';
import { childPids, cpuMicros, freePort, spawnTracked, stopChild, sumOver, waitForPort } from './lib/proc.js';
import { fmtSummary, updateDocs } from './lib/report.js';
import { median, percentile, summarize, type Summary } from './lib/stats.js';
import { analyseProfile, groupOf, renderProfile } from './profile.js';
import { machineInfo, type MachineInfo } from './lib/tools.js';

export const MCP_PEERS = ['direct', 'node-floor', 'forwarder', 'cli-proxy', 'mcp-remote', 'supergateway'] as const;
/** `forwarder-base`: the forwarder of another build (`--mcp-base-cli`), run beside this one to measure a change. */
export type McpPeerName = (typeof MCP_PEERS)[number] | 'forwarder-base';
export const FRAMINGS = ['sse', 'json'] as const;
export type Framing = (typeof FRAMINGS)[number];
export const PATTERNS = { serial: 1, c8: 8 } as const;
export type Pattern = keyof typeof PATTERNS;

const ALLOC_SAMPLER_JS = join(BENCH_BUILD_DIR, 'alloc-sampler.js');
const ALLOC_PEERS = ['node-floor', 'forwarder', 'forwarder-base'] as const;

/** The tool's argument and answer: 1 000 characters, the size of the wrk test's JSON body. */
const TEXT = 'x'.repeat(1_000);

export interface McpBenchOptions {
  /** Calls per peer, framing, pattern and round. */
  calls: number;
  /** Calls per batch: the unit the peer order rotates by. */
  batch: number;
  rounds: number;
  peers: McpPeerName[];
  /** Install mcp-remote and supergateway from the npm registry when they are not cached. */
  install: boolean;
  docs: boolean;
  /** Run the forwarder and the Node floor with `--cpu-prof` and print where the forwarder's CPU goes above the floor's. */
  profile: boolean;
  /**
   * Run the forwarder(s) and the Node floor under V8's sampling heap profiler (collected
   * objects included) and print bytes allocated per call by function for each.
   */
  alloc?: boolean | undefined;
  /**
   * With `alloc`: leave out what the scavenger collected, so the profile is what outlived
   * the young generation (promoted, or alive at exit): what the mark-compactor pays for.
   */
  allocSurvivors?: boolean | undefined;
  /** The answer framings measured (default both). */
  framings?: Framing[] | undefined;
  cli: string;
  /** Another build's dist/cli.js: its forwarder joins the run as `forwarder-base`. */
  baseCli?: string | undefined;
  /**
   * The proxies run with the peer check (`--allowed-uids` of the bench's own UID), as the
   * units always do: each connection's UID asked of the kernel, the per-UID limits read.
   */
  peerCheck?: boolean | undefined;
  out: string | undefined;
}

export const MCP_USAGE = `  --mcp                  only the real-MCP-traffic run: the SDK client's tools/call through
                         direct, node-floor, forwarder, cli-proxy, mcp-remote, supergateway
                         (SSE and JSON answers, in a row and 8 at once; docs/performance.md)
  --mcp-calls N          (with --mcp) calls per peer, framing, pattern and round (default 3000)
  --mcp-batch N          (with --mcp) calls per interleaved batch (default 500)
  --mcp-peers LIST       (with --mcp) subset of ${MCP_PEERS.join(',')}
  --mcp-profile          (with --mcp) the forwarder and the Node floor run with --cpu-prof; prints
                         where the forwarder's CPU goes, and self time per call beside the floor's
  --mcp-alloc            (with --mcp) the forwarder(s) and the Node floor run under V8's sampling
                         heap profiler (collected objects included); prints bytes allocated
                         per call by function for each, largest difference first
  --mcp-alloc-survivors  (with --mcp) as --mcp-alloc, but only what outlived the young
                         generation (promoted): what makes the mark-compactor's work
  --mcp-framings LIST    (with --mcp) subset of ${FRAMINGS.join(',')} (default both)
  --mcp-base-cli FILE    (with --mcp) another build's dist/cli.js: its forwarder runs beside this
                         one as peer forwarder-base (a change measured before/after in one run)
  --mcp-peer-check       (with --mcp) the forwarder(s) and the cli-proxy check each connection's
                         peer (--allowed-uids of this UID), as the units do
  --install-peers        only install the pinned npm peers (${Object.entries(NPM_PEERS)
    .map(([n, v]) => `${n}@${v}`)
    .join(', ')}) into the cache, then exit`;

export function parseMcpArgs(argv: string[]): McpBenchOptions {
  const { value, num: n } = optionReader(argv);
  const num = (name: string, def: number): number => Math.ceil(n(name, def));
  const baseCli = value('mcp-base-cli');
  const known: readonly string[] = baseCli ? [...MCP_PEERS, 'forwarder-base'] : MCP_PEERS;
  const peers = (value('mcp-peers')?.split(',') ?? [...MCP_PEERS]).map((p) => {
    if (!known.includes(p)) throw new Error(`unknown MCP peer ${p} (known: ${known.join(', ')})`);
    return p as McpPeerName;
  });
  if (!peers.includes('direct')) peers.unshift('direct');
  if (baseCli && !peers.includes('forwarder-base')) peers.splice(peers.indexOf('forwarder') + 1 || peers.length, 0, 'forwarder-base');
  const calls = num('mcp-calls', 3_000);
  const framings = (value('mcp-framings')?.split(',') ?? [...FRAMINGS]).map((f) => {
    if (!(FRAMINGS as readonly string[]).includes(f)) throw new Error(`unknown framing ${f} (known: ${FRAMINGS.join(', ')})`);
    return f as Framing;
  });
  return {
    calls,
    batch: Math.min(calls, num('mcp-batch', 500)),
    rounds: num('reps', 3),
    peers,
    install: !argv.includes('--no-install'),
    docs: argv.includes('--docs'),
    profile: argv.includes('--mcp-profile'),
    alloc: argv.includes('--mcp-alloc') || argv.includes('--mcp-alloc-survivors'),
    allocSurvivors: argv.includes('--mcp-alloc-survivors'),
    framings,
    cli: value('cli') ?? DEFAULT_CLI,
    baseCli: baseCli && resolve(baseCli),
    peerCheck: argv.includes('--mcp-peer-check'),
    out: value('out'),
  };
}

/** One peer with one answer framing: an initialized client session and the processes whose CPU is the peer's. */
interface Route {
  peer: McpPeerName;
  framing: Framing;
  client: Client;
  pids(): number[];
  /** The cli-proxy's: until its audit events are written (bench/lib/audit-drain.ts). */
  auditDrained?: () => Promise<AuditDrain | undefined>;
  close(): Promise<void>;
}

/** A process and all its descendants (supergateway → sh → mcp-remote). */
function processTree(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) out.push(...childPids(out[i] as number));
  return out;
}

interface McpServerProc {
  pid: number;
  ports: number[];
  child: ChildProcess;
}

async function startMcpServer(modes: ('stateful' | 'stateless')[]): Promise<McpServerProc> {
  const child = spawnTracked(process.execPath, [MCP_SERVER_JS, modes.join(',')], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, BENCH_MCP_TOKEN: BENCH_TOKEN },
  });
  const hello = await new Promise<{ ports: number[] }>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once('line', (line) => resolve(JSON.parse(line) as { ports: number[] }));
    child.once('exit', (code) => reject(new Error(`bench MCP server exited (${code}) before listening`)));
  });
  return { pid: child.pid as number, ports: hello.ports, child };
}

/** The SDK's 60 s default is too short for a Node program's first answer on a 2-core machine at load 30+. */
const CONNECT = { timeout: 300_000 };

async function httpClient(url: string, headers: Record<string, string> = {}): Promise<Client> {
  const client = new Client({ name: 'agent-connectors-bench', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }), CONNECT);
  return client;
}

/** The environment of the npm peers: the header's value comes from it, never from argv. */
function npmPeerEnv(work: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined) env[k] = v;
  env.BENCH_AUTH = `Bearer ${BENCH_TOKEN}`;
  env.MCP_REMOTE_CONFIG_DIR = join(work, 'mcp-auth');
  return env;
}

/** mcp-remote's argv: `${BENCH_AUTH}` is expanded by mcp-remote itself from its environment. */
const mcpRemoteArgs = (bins: NpmPeerBins, url: string): string[] => [bins.mcpRemote, url, '--header', 'Authorization:${BENCH_AUTH}'];

async function startRoutes(
  peers: McpPeerName[],
  server: McpServerProc,
  work: string,
  cli: string,
  baseCli: string | undefined,
  bins: NpmPeerBins | undefined,
  log: (s: string) => void,
  profDir: string | undefined,
  framings: readonly Framing[] = FRAMINGS,
  peerCheck = false,
  alloc = false,
): Promise<{ routes: Route[]; stop: () => Promise<void> }> {
  const routes: Route[] = [];
  const stops: (() => Promise<void>)[] = [];
  const direct = (i: number, f: Framing): string => `http://127.0.0.1:${server.ports[i] as number}/${f}`;
  const stop = async (): Promise<void> => {
    for (const r of routes) await r.close().catch(() => undefined);
    for (const s of stops) await s();
  };
  try {
    await startEach();
  } catch (err) {
    await stop();
    throw err;
  }
  return { routes, stop };

  async function startEach(): Promise<void> {
    for (const [i, name] of peers.entries()) {
      log(`  starting ${name}`);
      switch (name) {
        case 'direct':
          for (const framing of framings) {
            const client = await httpClient(direct(i, framing), { authorization: `Bearer ${BENCH_TOKEN}` });
            routes.push({ peer: name, framing, client, pids: () => [], close: () => client.close() });
          }
          break;
        case 'node-floor':
        case 'forwarder':
        case 'forwarder-base':
        case 'cli-proxy': {
          if (name === 'forwarder-base' && !baseCli) throw new Error('peer forwarder-base needs --mcp-base-cli');
          const peer: Peer = await startPeer(name === 'forwarder-base' ? 'forwarder' : name, {
            cli: name === 'forwarder-base' ? (baseCli as string) : cli,
            upstreamPort: server.ports[i] as number,
            endpoints: { sse: '/sse', json: '/json' },
            workDir: work,
            floorReadsToken: true,
            extraArgs: peerCheck && name !== 'node-floor' ? ['--allowed-uids', String(process.getuid?.() ?? 0)] : undefined,
            // The floor is profiled too (the same profiler overhead on both), to compare them function by function.
            nodeArgs: [
              ...((name === 'forwarder' || name === 'node-floor') && profDir ? ['--cpu-prof', '--cpu-prof-dir', join(profDir, name), '--cpu-prof-interval', '200'] : []),
              ...(alloc && name !== 'cli-proxy' ? ['--import', ALLOC_SAMPLER_JS] : []),
            ],
          });
          stops.push(() => peer.stop());
          for (const framing of framings) {
            const client = await httpClient(peer.url(framing));
            routes.push({ peer: name, framing, client, pids: () => peer.pids(), auditDrained: () => peer.auditDrained(), close: () => client.close() });
          }
          break;
        }
        case 'mcp-remote': {
          if (!bins) break;
          for (const framing of framings) {
            const logPath = join(work, `mcp-remote-${framing}.log`);
            const logFd = openSync(logPath, 'a');
            const transport = new StdioClientTransport({
              command: process.execPath,
              args: mcpRemoteArgs(bins, direct(i, framing)),
              env: npmPeerEnv(work),
              stderr: logFd,
            });
            const client = new Client({ name: 'agent-connectors-bench', version: '1.0.0' });
            closeSync(logFd);
            await client.connect(transport, CONNECT).catch((err: unknown) => {
              throw new Error(`mcp-remote: ${err instanceof Error ? err.message : String(err)}\n${readFileSync(logPath, 'utf8').slice(-2000)}`);
            });
            const pid = transport.pid as number;
            const tree = processTree(pid);
            routes.push({ peer: name, framing, client, pids: () => tree, close: () => client.close() });
          }
          break;
        }
        case 'supergateway': {
          if (!bins) break;
          for (const framing of framings) {
            const port = await freePort();
            const logPath = join(work, `supergateway-${framing}.log`);
            const out = openSync(logPath, 'a');
            // supergateway runs --stdio through a shell: single quotes keep ${BENCH_AUTH} for mcp-remote to expand.
            const stdio = `${process.execPath} ${mcpRemoteArgs(bins, direct(i, framing))
              .map((a) => `'${a}'`)
              .join(' ')}`;
            const child = spawnTracked(
              process.execPath,
              [bins.supergateway, '--stdio', stdio, '--outputTransport', 'streamableHttp', '--stateful', '--port', String(port), '--logLevel', 'none'],
              { stdio: ['ignore', out, out], env: npmPeerEnv(work) },
            );
            closeSync(out);
            stops.push(() => stopChild(child));
            await Promise.race([
              waitForPort(port, 30_000),
              new Promise<never>((_, reject) => child.once('exit', () => reject(new Error(`supergateway exited before listening:\n${readFileSync(logPath, 'utf8').slice(-2000)}`)))),
            ]);
            const client = await httpClient(`http://127.0.0.1:${port}/mcp`);
            // The session's mcp-remote child exists once the session does.
            const tree = processTree(child.pid as number);
            routes.push({ peer: name, framing, client, pids: () => tree, close: () => client.close() });
          }
          break;
        }
      }
    }
  }
}

interface BatchResult {
  latUs: number[];
  cpuUs: number;
  serverCpuUs: number;
}

async function runBatch(route: Route, calls: number, concurrency: number, serverPid: number): Promise<BatchResult> {
  const pids = route.pids();
  const cpu0 = sumOver(pids, cpuMicros);
  const server0 = cpuMicros(serverPid);
  const latUs: number[] = [];
  let started = 0;
  const worker = async (): Promise<void> => {
    while (started < calls) {
      started++;
      const t0 = performance.now();
      const r = await route.client.callTool({ name: 'echo', arguments: { text: TEXT } });
      latUs.push((performance.now() - t0) * 1000);
      const c = (r.content as { type: string; text?: string }[] | undefined)?.[0];
      if (r.isError || c?.text !== TEXT) throw new Error(`${route.peer}/${route.framing}: wrong answer ${JSON.stringify(r).slice(0, 200)}`);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { latUs, cpuUs: sumOver(pids, cpuMicros) - cpu0, serverCpuUs: cpuMicros(serverPid) - server0 };
}

/** One round's figures for one peer, framing and pattern. */
export interface McpCell {
  calls: number;
  /** Peer CPU per call, µs; undefined for direct (no proxy). */
  cpuUsPerCall: number | undefined;
  serverCpuUsPerCall: number;
  p50Ms: number;
  p99Ms: number;
  addedP50Ms: number | undefined;
  addedP99Ms: number | undefined;
}

/** key: `${framing} ${pattern}` → peer → cell. */
export type McpRound = Record<string, Partial<Record<McpPeerName, McpCell>>>;

export interface McpSummaryRow {
  framing: Framing;
  pattern: Pattern;
  peer: McpPeerName;
  cpuUsPerCall: Summary;
  serverCpuUsPerCall: Summary;
  p50Ms: Summary;
  p99Ms: Summary;
  addedP50Ms: Summary;
  addedP99Ms: Summary;
  /** CPU per call ÷ the Node floor's, within each round. */
  cpuVsFloor: Summary;
}

export interface McpBenchResults {
  machine: MachineInfo;
  loadAvgAtEnd: number[];
  options: McpBenchOptions;
  versions: Record<string, string>;
  peers: McpPeerName[];
  notes: string[];
  durationS: number;
  rounds: McpRound[];
  rows: McpSummaryRow[];
}

const key = (f: Framing, p: Pattern): string => `${f} ${p}`;

function rotate<T>(xs: readonly T[], k: number): T[] {
  const s = k % xs.length;
  return [...xs.slice(s), ...xs.slice(0, s)];
}

function summarizeRounds(rounds: McpRound[], peers: McpPeerName[]): McpSummaryRow[] {
  const rows: McpSummaryRow[] = [];
  for (const pattern of Object.keys(PATTERNS) as Pattern[]) {
    for (const framing of FRAMINGS) {
      for (const peer of peers) {
        const cells = rounds.map((r) => r[key(framing, pattern)]?.[peer]);
        if (cells.every((c) => c === undefined)) continue;
        const s = (f: (c: McpCell) => number | undefined): Summary => summarize(cells.map((c) => (c ? f(c) : undefined)));
        rows.push({
          framing,
          pattern,
          peer,
          cpuUsPerCall: s((c) => c.cpuUsPerCall),
          serverCpuUsPerCall: s((c) => c.serverCpuUsPerCall),
          p50Ms: s((c) => c.p50Ms),
          p99Ms: s((c) => c.p99Ms),
          addedP50Ms: s((c) => c.addedP50Ms),
          addedP99Ms: s((c) => c.addedP99Ms),
          cpuVsFloor: summarize(
            rounds.map((r) => {
              const mine = r[key(framing, pattern)]?.[peer]?.cpuUsPerCall;
              const floor = r[key(framing, pattern)]?.['node-floor']?.cpuUsPerCall;
              return mine !== undefined && floor ? mine / floor : undefined;
            }),
          ),
        });
      }
    }
  }
  return rows;
}

export function renderMcpMarkdown(res: McpBenchResults): string {
  const m = res.machine;
  const o = res.options;
  const lines = [
    `Run of ${m.date.slice(0, 16).replace('T', ' ')} UTC (${res.rounds.length} round${res.rounds.length > 1 ? 's' : ''}, ${Math.round(res.durationS)} s): ` +
      `${m.cpuModel}, ${m.cores} cores, Node ${m.node}, MCP SDK ${res.versions.sdk ?? '?'}, ${Object.entries(NPM_PEERS)
        .map(([n, v]) => `${n} ${v}`)
        .join(', ')}; load average at start ${m.loadAvgAtStart.join(' / ')}, at end ${res.loadAvgAtEnd.join(' / ')}; commit ${m.commit ?? '?'}${m.srcDirty ? ' with uncommitted changes in src/' : ''}.`,
    '',
    `${o.calls} \`tools/call\` per peer, framing, pattern and round (1 000-character argument and answer), in batches of ${o.batch}, the peer order rotated per batch. ` +
      'Median (min–max) over rounds; added latency is taken against direct within each round; server CPU is the SDK server process\'s, per call.',
  ];
  for (const n of res.notes) lines.push('', `> ${n}`);
  lines.push(
    '',
    '| answers | calls | peer | peer CPU µs/call | × node-floor | server CPU µs/call | p50 ms | p99 ms | added p50 ms | added p99 ms |',
    '|---|---|---|---|---|---|---|---|---|---|',
  );
  for (const r of res.rows) {
    const d = r.peer === 'direct';
    lines.push(
      `| ${r.framing.toUpperCase()} | ${r.pattern === 'serial' ? 'in a row' : '8 at once'} | ${r.peer} | ${d ? '–' : fmtSummary(r.cpuUsPerCall, 0)} | ` +
        `${d || r.peer === 'node-floor' ? '–' : fmtSummary(r.cpuVsFloor, 2)} | ${fmtSummary(r.serverCpuUsPerCall, 0)} | ${fmtSummary(r.p50Ms, 3)} | ${fmtSummary(r.p99Ms, 3)} | ` +
        `${d ? '–' : fmtSummary(r.addedP50Ms, 3)} | ${d ? '–' : fmtSummary(r.addedP99Ms, 3)} |`,
    );
  }
  return lines.join('\n');
}

/** A profiled peer's `.cpuprofile` and its calls over the whole run (warm-up included, as the profile is). */
function profiledPeer(profDir: string, peer: 'forwarder' | 'node-floor', rounds: McpRound[], opts: McpBenchOptions): { file: string; calls: number; cpu: number } | undefined {
  const dir = join(profDir, peer);
  const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
  if (!file) return undefined;
  const cells = rounds.flatMap((r) => Object.values(r).map((row) => row[peer])).filter((c): c is McpCell => c !== undefined);
  const warmUp = (opts.framings ?? FRAMINGS).length * Math.min(200, opts.calls);
  return { file: join(dir, file), calls: cells.reduce((n, c) => n + c.calls, 0) + warmUp, cpu: median(cells.map((c) => c.cpuUsPerCall ?? NaN)) };
}

/**
 * The forwarder's `--cpu-prof` profile over the whole run, rendered as bench/profile.ts does
 * for wrk; with the floor's beside it, self time per call by function for both, largest
 * difference first. Sampled time per call (start-up included, a few hundred ms over
 * tens of thousands of calls), not scaled to /proc's CPU.
 */
function profileReport(profDir: string, rounds: McpRound[], opts: McpBenchOptions, log: (s: string) => void): void {
  const fwd = profiledPeer(profDir, 'forwarder', rounds, opts);
  if (!fwd) throw new Error('the forwarder wrote no .cpuprofile (did it exit cleanly on SIGTERM?)');
  type Profile = Parameters<typeof analyseProfile>[0];
  const load = (f: string): Profile => JSON.parse(readFileSync(f, 'utf8')) as Profile;
  const summary = analyseProfile(load(fwd.file), fwd.calls, fwd.cpu);
  mkdirSync(RESULTS_DIR, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  const kept = resolve(RESULTS_DIR, `forwarder-mcp-${stamp}.cpuprofile`);
  copyFileSync(fwd.file, kept);
  log(`${renderProfile(summary)}\nprofile: ${kept}`);
  const floor = rounds.length > 0 && opts.peers.includes('node-floor') ? profiledPeer(profDir, 'node-floor', rounds, opts) : undefined;
  if (!floor) return;
  const floorKept = resolve(RESULTS_DIR, `node-floor-mcp-${stamp}.cpuprofile`);
  copyFileSync(floor.file, floorKept);
  const a = selfUsPerCall(load(fwd.file), fwd.calls);
  const b = selfUsPerCall(load(floor.file), floor.calls);
  const total = (m: Map<string, number>): number => [...m.values()].reduce((x, y) => x + y, 0);
  const names = [...new Set([...a.keys(), ...b.keys()])];
  const rows = names
    .map((name) => ({ name, fwd: a.get(name) ?? 0, floor: b.get(name) ?? 0 }))
    .sort((x, y) => Math.abs(y.fwd - y.floor) - Math.abs(x.fwd - x.floor))
    .slice(0, 40);
  log(
    [
      '',
      `#### Self time per call by function: forwarder ${total(a).toFixed(1)} µs, node-floor ${total(b).toFixed(1)} µs (sampled, busy samples / calls)`,
      '',
      '| function | forwarder µs/call | node-floor µs/call | difference |',
      '|---|---|---|---|',
      ...rows.map((r) => `| \`${r.name.replace(/\|/g, '\\|')}\` | ${r.fwd.toFixed(2)} | ${r.floor.toFixed(2)} | ${(r.fwd - r.floor).toFixed(2)} |`),
      `profile: ${floorKept}`,
    ].join('\n'),
  );
}

/** The calls a peer served over the whole run, warm-up included (as a profile of the process is). */
function callsOf(peer: McpPeerName, rounds: McpRound[], opts: McpBenchOptions): number {
  const cells = rounds.flatMap((r) => Object.values(r).map((row) => row[peer])).filter((c): c is McpCell => c !== undefined);
  return cells.reduce((n, c) => n + c.calls, 0) + (opts.framings ?? FRAMINGS).length * Math.min(200, opts.calls);
}

interface HeapNode {
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number; scriptId?: string };
  selfSize: number;
  children?: HeapNode[];
}

/**
 * Bytes allocated per call by function (V8's estimate from its samples, collected objects
 * included), two ways: the allocating function itself, and the innermost frame of our own
 * code (dist/ or the floor's bench/ script) on its stack, which names the request step that
 * caused an allocation inside Node or undici. Start-up is included (a few MB over tens of
 * thousands of calls).
 */
function allocReport(dir: string, pids: Map<number, McpPeerName>, rounds: McpRound[], opts: McpBenchOptions, log: (s: string) => void): void {
  const bySelf = new Map<McpPeerName, Map<string, number>>();
  const byOurs = new Map<McpPeerName, Map<string, number>>();
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  for (const file of readdirSync(dir)) {
    const pid = Number(/^alloc-(\d+)\.heapprofile$/.exec(file)?.[1]);
    const peer = pids.get(pid);
    if (!peer) continue;
    // The warm-up's calls are not in the profile (the sampler restarted after them).
    const calls = callsOf(peer, rounds, opts) - (opts.framings ?? FRAMINGS).length * Math.min(200, opts.calls);
    mkdirSync(RESULTS_DIR, { recursive: true });
    copyFileSync(join(dir, file), resolve(RESULTS_DIR, `${peer}-mcp-${stamp}.heapprofile`));
    const root = (JSON.parse(readFileSync(join(dir, file), 'utf8')) as { head: HeapNode }).head;
    const self = new Map<string, number>();
    const ours = new Map<string, number>();
    const add = (m: Map<string, number>, k: string, v: number): void => {
      m.set(k, (m.get(k) ?? 0) + v / calls);
    };
    const walk = (n: HeapNode, own: string): void => {
      const f = n.callFrame;
      const isOurs = /\/dist\/|\/build\/bench\//.test(f.url);
      const here = isOurs ? `${f.functionName || '(anonymous)'} ${groupOf(f)}:${f.lineNumber + 1}` : own;
      if (n.selfSize > 0) {
        add(self, `${f.functionName || '(anonymous)'} ${f.url ? groupOf(f) : ''}`.trim(), n.selfSize);
        add(ours, here, n.selfSize);
      }
      for (const c of n.children ?? []) walk(c, here);
    };
    walk(root, '(outside our code)');
    bySelf.set(peer, self);
    byOurs.set(peer, ours);
  }
  const peers = ALLOC_PEERS.filter((p) => bySelf.has(p));
  if (peers.length === 0) throw new Error('no peer wrote its allocation profile (did it exit cleanly on SIGTERM?)');
  const total = (m: Map<string, number> | undefined): number => [...(m?.values() ?? [])].reduce((x, y) => x + y, 0);
  const table = (title: string, maps: Map<McpPeerName, Map<string, number>>, rows: number): string[] => {
    const names = [...new Set(peers.flatMap((p) => [...(maps.get(p)?.keys() ?? [])]))];
    const diff = (name: string): number => (maps.get('forwarder')?.get(name) ?? 0) - (maps.get('node-floor')?.get(name) ?? 0);
    const fmt = (v: number | undefined): string => (v === undefined ? '0' : v.toFixed(0));
    return [
      '',
      `#### ${title}: ${peers.map((p) => `${p} ${total(maps.get(p)).toFixed(0)} B`).join(', ')} per call`,
      '',
      `| function | ${peers.map((p) => `${p} B/call`).join(' | ')} |`,
      `|---|${peers.map(() => '---|').join('')}`,
      ...names
        .sort((a, b) => Math.abs(diff(b)) - Math.abs(diff(a)) || (maps.get(peers[0] as McpPeerName)?.get(b) ?? 0) - (maps.get(peers[0] as McpPeerName)?.get(a) ?? 0))
        .slice(0, rows)
        .map((n) => `| \`${n.replace(/\|/g, '\\|')}\` | ${peers.map((p) => fmt(maps.get(p)?.get(n))).join(' | ')} |`),
    ];
  };
  log(
    [
      ...table(
        opts.allocSurvivors
          ? 'Bytes per call that outlived the young generation, by allocating function (sampled)'
          : 'Bytes allocated per call by allocating function (sampled, collected objects included)',
        bySelf,
        40,
      ),
      ...table('The same by the innermost frame of our own code on the stack', byOurs, 40),
      `profiles: ${RESULTS_DIR}/*-mcp-${stamp}.heapprofile`,
    ].join('\n'),
  );
}

/** Busy self time per call by function (name and package or file, no line: the two builds' lines differ), µs. */
function selfUsPerCall(p: Parameters<typeof analyseProfile>[0], calls: number): Map<string, number> {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const out = new Map<string, number>();
  for (let i = 0; i < p.samples.length; i++) {
    const f = byId.get(p.samples[i] as number)?.callFrame;
    if (!f || f.functionName === '(idle)') continue;
    const key = `${f.functionName || '(anonymous)'} ${f.url ? groupOf(f) : ''}`.trim();
    out.set(key, (out.get(key) ?? 0) + (p.timeDeltas[i + 1] ?? 0) / calls);
  }
  return out;
}

export const MCP_DOCS_BEGIN = '<!-- bench-mcp:begin (generated by npm run bench -- --mcp --docs; edit outside these markers) -->';
export const MCP_DOCS_END = '<!-- bench-mcp:end -->';

export async function runMcpBench(opts: McpBenchOptions, log: (s: string) => void): Promise<McpBenchResults> {
  const started = Date.now();
  const machine = machineInfo();
  const notes: string[] = [];
  let peers = [...opts.peers];
  const wantsNpm = peers.includes('mcp-remote') || peers.includes('supergateway');
  let bins: NpmPeerBins | undefined;
  if (wantsNpm) {
    bins = installedNpmPeers();
    if (!bins && opts.install) {
      try {
        bins = await installNpmPeers(log);
      } catch (err) {
        log(`npm peers: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    if (!bins) {
      peers = peers.filter((p) => p !== 'mcp-remote' && p !== 'supergateway');
      notes.push('mcp-remote and supergateway are not installed (npm run bench -- --install-peers): skipped.');
      log(notes[notes.length - 1] as string);
    }
  }
  if (peers.includes('cli-proxy')) {
    notes.push(
      'The cli-proxy passes the answer headers a CLI reads (docs/shims.md), not Mcp-Session-Id: its server port runs the SDK stateless ' +
        '(a fresh server and transport per request), which costs the server more per call (its server CPU column) and shows in its added latency.',
    );
  }
  const sdkPkg = JSON.parse(readFileSync(resolve(REPO_ROOT, 'node_modules/@modelcontextprotocol/sdk/package.json'), 'utf8')) as { version: string };
  const out = opts.out ? resolve(opts.out) : resolve(REPO_ROOT, 'build/bench-results', `mcp-${machine.date.replace(/[:.]/g, '-')}.json`);
  const rounds: McpRound[] = [];
  /** Written after every round too: a run cut short (a busy machine, a deadline) keeps what it measured. */
  const save = (): McpBenchResults => {
    const results: McpBenchResults = {
      machine,
      loadAvgAtEnd: loadavg().map((x) => Math.round(x * 100) / 100),
      options: opts,
      versions: { sdk: sdkPkg.version, ...NPM_PEERS },
      peers,
      notes,
      durationS: (Date.now() - started) / 1000,
      rounds,
      rows: summarizeRounds(rounds, peers),
    };
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
    return results;
  };
  const work = newWorkDir();
  // The cli-proxy passes the answer headers a CLI reads (docs/shims.md), not Mcp-Session-Id.
  const server = await startMcpServer(peers.map((p) => (p === 'cli-proxy' ? 'stateless' : 'stateful')));
  try {
    log(`MCP bench: ${peers.join(', ')}; ${opts.rounds} rounds × ${opts.calls} calls per peer, framing and pattern`);
    const profDir = opts.profile ? join(work, 'prof') : undefined;
    if (profDir) for (const p of ['forwarder', 'node-floor']) mkdirSync(join(profDir, p), { recursive: true });
    const allocDir = opts.alloc ? join(work, 'alloc') : undefined;
    if (allocDir) {
      mkdirSync(allocDir, { recursive: true });
      // Read by bench/alloc-sampler.ts in the peers started below (they inherit this environment).
      process.env.BENCH_ALLOC_DIR = allocDir;
      if (opts.allocSurvivors) process.env.BENCH_ALLOC_SURVIVORS = '1';
    }
    const { routes, stop } = await startRoutes(peers, server, work, opts.cli, opts.baseCli, bins, log, profDir, opts.framings, opts.peerCheck, opts.alloc);
    delete process.env.BENCH_ALLOC_DIR;
    delete process.env.BENCH_ALLOC_SURVIVORS;
    const allocPids = new Map<number, McpPeerName>();
    if (allocDir) for (const r of routes) if ((ALLOC_PEERS as readonly string[]).includes(r.peer)) allocPids.set(r.pids()[0] as number, r.peer);
    try {
      /**
       * After a batch through the cli-proxy: its audit events written before the next batch
       * of any peer starts (a backlog written meanwhile would be that batch's CPU, or load
       * beside it); charged to no batch. Past the bound, said once and the run goes on.
       */
      const settle = async (r: Route): Promise<void> => {
        const d = await r.auditDrained?.();
        if (d && !d.drained) log(`  WARNING ${r.peer}'s audit queue still held ${d.left} events after ${(d.ms / 1000).toFixed(0)} s; going on`);
      };
      // Warm-up: JIT, pools, the sessions' first calls; nothing recorded.
      for (const r of routes) {
        await runBatch(r, Math.min(200, opts.calls), 8, server.pid);
        await settle(r);
      }
      if (allocPids.size > 0) {
        // bench/alloc-sampler.ts drops what it sampled so far: the report is per measured call.
        for (const pid of allocPids.keys()) process.kill(pid, 'SIGUSR2');
        await new Promise((r) => setTimeout(r, 500));
      }
      for (let round = 0; round < opts.rounds; round++) {
        const result: McpRound = {};
        rounds.push(result);
        for (const [pattern, concurrency] of Object.entries(PATTERNS) as [Pattern, number][]) {
          for (const framing of opts.framings ?? FRAMINGS) {
            const rs = routes.filter((r) => r.framing === framing);
            const acc = new Map<McpPeerName, BatchResult>(rs.map((r) => [r.peer, { latUs: [], cpuUs: 0, serverCpuUs: 0 }]));
            const batches = Math.ceil(opts.calls / opts.batch);
            for (let b = 0; b < batches; b++) {
              const n = Math.min(opts.batch, opts.calls - b * opts.batch);
              for (const r of rotate(rs, round + b)) {
                const got = await runBatch(r, n, concurrency, server.pid);
                await settle(r);
                const a = acc.get(r.peer) as BatchResult;
                a.latUs.push(...got.latUs);
                a.cpuUs += got.cpuUs;
                a.serverCpuUs += got.serverCpuUs;
              }
            }
            const row: Partial<Record<McpPeerName, McpCell>> = (result[key(framing, pattern)] = {});
            for (const [peer, a] of acc) {
              const sorted = a.latUs.sort((x, y) => x - y);
              row[peer] = {
                calls: sorted.length,
                cpuUsPerCall: peer === 'direct' ? undefined : a.cpuUs / sorted.length,
                serverCpuUsPerCall: a.serverCpuUs / sorted.length,
                p50Ms: percentile(sorted, 50) / 1000,
                p99Ms: percentile(sorted, 99) / 1000,
                addedP50Ms: undefined,
                addedP99Ms: undefined,
              };
            }
            const d = row.direct;
            for (const c of Object.values(row)) {
              if (!d || c === d) continue;
              c.addedP50Ms = c.p50Ms - d.p50Ms;
              c.addedP99Ms = c.p99Ms - d.p99Ms;
            }
            log(
              `  round ${round + 1} ${framing} ${pattern}: ` +
                Object.entries(row)
                  .map(([p, c]) => `${p} ${c.cpuUsPerCall === undefined ? '-' : c.cpuUsPerCall.toFixed(0)} µs, p50 ${c.p50Ms.toFixed(3)} ms`)
                  .join('; '),
            );
          }
        }
        save();
      }
    } finally {
      await stop();
    }
    if (profDir) profileReport(profDir, rounds, opts, log);
    if (allocDir) allocReport(allocDir, allocPids, rounds, opts, log);
  } finally {
    await stopChild(server.child);
    removeWorkDir(work);
  }
  const results = save();
  log(`results: ${out}`);
  if (opts.docs) {
    updateDocs(DOCS_FILE, renderMcpMarkdown(results), MCP_DOCS_BEGIN, MCP_DOCS_END);
    log(`updated ${DOCS_FILE}`);
  }
  return results;
}
