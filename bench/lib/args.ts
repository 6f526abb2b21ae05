/** Command-line options of `npm run bench -- …`. */
import { ALL_PEERS, type PeerName } from './peers.js';
import { DEFAULT_CLI } from './paths.js';

export interface BenchOptions {
  mode: 'full' | 'quick' | 'streams' | 'smoke' | 'profile' | 'rotation' | 'link';
  reps: number;
  /** wrk duration per (concurrency, peer), seconds. */
  seconds: number;
  concurrency: number[];
  peers: PeerName[];
  sseStreams: number[];
  /** The stream scenarios to run (`--only`); all of them by default. */
  only: ReadonlySet<StreamScenario>;
  sseSeconds: number;
  sseIntervalMs: number;
  bigMiB: number;
  bigRateMiB: number;
  idleStreams: number[];
  ttfhSamples: number;
  install: boolean;
  docs: boolean;
  cli: string;
  /** A second CLI run as the peer `forwarder-base`, interleaved with the forwarder (`--base-cli`). */
  baseCli: string | undefined;
  out: string | undefined;
}

export const STREAM_SCENARIOS = ['sse', 'ttfh', 'big', 'idle'] as const;
export type StreamScenario = (typeof STREAM_SCENARIOS)[number];

export const USAGE = `usage: npm run bench -- [options]
  (default)              full run: every peer, every measurement, --reps repetitions
  --quick                short run (1 repetition, short durations, fewer idle streams)
  --streams              only the stream scenarios (SSE latency at 1, 32, 256 streams, time
                         to headers, the slow reader, idle streams), node-floor included;
                         with --quick: short durations and 200/1000 idle streams
  --base-cli PATH        also run PATH's forwarder as the peer forwarder-base, interleaved
                         with the forwarder (an A/B of two builds in one run)
  --smoke                a few seconds against the forwarder only, no nginx/wrk; exits 1
                         if a behaviour check fails (ordering, byte counts, flat memory)
  --profile              CPU-profile the forwarder under wrk load and print where the time goes
  --with-metrics         (with --profile) the forwarder serves metrics, to see what they add
  --rotation             only the rotation run: 1 000 token rotations by real fetch + apply
                         against the strict Gateway under load (a full run ends with it too;
                         docs/rotation.md)
  --link                 only the host link's figures: connect/disconnect latency over 100
                         changes, the link's CPU and RSS idle and with 10 000 bindings
                         (6 minutes on a busy 2-core VM; docs/host-link.md)
  --renew-burst          only renew fetch's rate for 2 000 new slots at --renew-concurrency
                         1 and 8, twice each (docs/host-link.md)
  --scale                only the host's growth (docs/scale.md): a desired state of 10, 100,
                         1 000, 10 000 bindings (providers a tenth) published → in force,
                         then each part's idle RSS and CPU once every token is held;
                         --sizes=10,100 for fewer, --tokens-wait=S (default 240)
  --scale-plot A.json [B.json]  the growth plot (SVG, stdout) from --scale results
  --renew-scale          only renewal at scale, end to end: 10 000 new bindings' tokens, 25
                         disconnects during the burst, a host revocation during one
                         (--bindings N, --probes N, --renew-concurrency N; docs/host-link.md)
  --watcher              only the file watcher's cost: chokidar against fs.watch on a
                         directory of 10 000 token files, 3 runs each (docs/performance.md)
  --metrics              only the metrics cost: forwarder CPU per request with --metrics-listen
                         off and on, alternating (a full run includes it; docs/metrics.md)
  --audit                only the audit cost: cli-proxy CPU and disk writes per request with
                         --no-audit and with the spool on, alternating (docs/audit.md)
  --audit-wrk            only the audit cost at wrk rates: cli-proxies with --no-audit, the
                         audit on and the audit on a full spool, in turns at each --concurrency;
                         CPU per request in the cell and with the spool's drain after it
                         (--reps, --seconds; --cpu-prof: one repetition under V8's profiler,
                         the audit path's JS time by function; --spool-dir DIR: the spools
                         on another file system; docs/audit.md)
  --tls                  only TLS mode's cost per call (first call, new CONNECT, keep-alive
                         in one tunnel) against base-url mode and direct calls, and the
                         leaf minting alone (docs/design/tls-mode.md)
  --limits               only each part's RSS, fds and tasks, idle and under load (1 000
                         streams and 100 callers per proxy; link and apply with 10 000
                         bindings): what the units' MemoryMax=, LimitNOFILE=, TasksMax= are
                         chosen from (docs/units.md)
  --reps N               repetitions (default 3)
  --seconds S            wrk duration per concurrency and peer (default 4)
  --concurrency 1,16,64  wrk connections
  --peers LIST           subset of ${ALL_PEERS.join(',')}
  --sse-streams 1,32,256 the SSE stream counts (default 1,32,256)
  --only sse,ttfh,big,idle  run only these stream scenarios (e.g. --streams --only sse
                         --sse-streams 32: the 32-stream cell alone)
  --sse-seconds S        duration of each SSE latency run (default 4)
  --sse-interval-ms MS   per-stream event interval at up to 32 streams (default 10); above 32
                         streams it grows with the count, keeping 32 streams' event rate
  --big-mib N            size of the large body (default 200)
  --big-rate-mib N       pace of the slow reader, MiB/s (default 10)
  --idle 1000,10000      idle SSE stream counts
  --ttfh-samples N       time-to-headers samples per peer and repetition (default 10)
  --no-install           do not apt-get install nginx/wrk when missing
  --docs / --no-docs     write docs/performance.md (default: full runs only)
  --cli PATH             the agent-connectors CLI (default dist/cli.js, or $BENCH_CLI)
  --out FILE             results JSON (default bench/results/<timestamp>.json)`;

function list(v: string): number[] {
  return v.split(',').map((x) => {
    const n = Number(x);
    if (!Number.isFinite(n) || n <= 0) throw new Error(`not a positive number: ${x}`);
    return n;
  });
}

function scenarios(v: string | undefined): ReadonlySet<StreamScenario> {
  if (v === undefined) return new Set(STREAM_SCENARIOS);
  return new Set(
    v.split(',').map((x) => {
      if (!(STREAM_SCENARIOS as readonly string[]).includes(x)) throw new Error(`--only: unknown scenario ${x} (known: ${STREAM_SCENARIOS.join(', ')})`);
      return x as StreamScenario;
    }),
  );
}

/** `--name value` and `--name N` (a positive number, `def` when absent) readers over argv. */
export function optionReader(argv: string[]): { value: (name: string) => string | undefined; num: (name: string, def: number) => number } {
  const value = (name: string): string | undefined => {
    const i = argv.indexOf(`--${name}`);
    if (i < 0) return undefined;
    const v = argv[i + 1];
    if (v === undefined || v.startsWith('--')) throw new Error(`--${name} needs a value`);
    return v;
  };
  const num = (name: string, def: number): number => {
    const v = value(name);
    if (v === undefined) return def;
    const n = Number(v);
    if (!Number.isFinite(n) || n <= 0) throw new Error(`--${name}: not a positive number: ${v}`);
    return n;
  };
  return { value, num };
}

export function parseArgs(argv: string[]): BenchOptions {
  const flags = new Set(argv.filter((a) => a.startsWith('--')));
  const { value, num } = optionReader(argv);
  const known = new Set([
    'quick', 'streams', 'base-cli', 'smoke', 'profile', 'rotation', 'link', 'reps', 'seconds', 'concurrency', 'peers', 'sse-seconds', 'sse-streams', 'only', 'sse-interval-ms', 'big-mib',
    'big-rate-mib', 'idle', 'ttfh-samples', 'no-install', 'docs', 'no-docs', 'cli', 'out', 'help',
  ]);
  for (const f of flags) if (!known.has(f.slice(2))) throw new Error(`unknown option ${f}`);
  const mode = flags.has('--smoke') ? 'smoke' : flags.has('--profile') ? 'profile' : flags.has('--rotation') ? 'rotation' : flags.has('--link') ? 'link' : flags.has('--streams') ? 'streams' : flags.has('--quick') ? 'quick' : 'full';
  const quick = mode === 'quick' || (mode === 'streams' && flags.has('--quick'));
  const baseCli = value('base-cli');
  // The stream scenarios have no use for the warn-level forwarder (it differs in the access line only).
  const defaultPeers = mode === 'streams' ? ALL_PEERS.filter((p) => p !== 'forwarder-warn') : [...ALL_PEERS];
  const peers = (value('peers')?.split(',') ?? defaultPeers).map((p) => {
    if (!(ALL_PEERS as readonly string[]).includes(p)) throw new Error(`unknown peer ${p} (known: ${ALL_PEERS.join(', ')})`);
    return p as PeerName;
  });
  if (baseCli !== undefined && !peers.includes('forwarder-base')) peers.splice(peers.indexOf('forwarder') + 1, 0, 'forwarder-base');
  return {
    mode,
    reps: num('reps', quick ? 1 : 3),
    seconds: num('seconds', quick ? 1 : 4),
    // The stream scenarios alone leave the JSON test out.
    concurrency: mode === 'streams' ? [] : list(value('concurrency') ?? '1,16,64'),
    peers,
    sseStreams: list(value('sse-streams') ?? '1,32,256'),
    only: scenarios(value('only')),
    sseSeconds: num('sse-seconds', quick ? 1 : 4),
    sseIntervalMs: num('sse-interval-ms', 10),
    bigMiB: num('big-mib', quick ? 32 : 200),
    bigRateMiB: num('big-rate-mib', quick ? 32 : 10),
    idleStreams: list(value('idle') ?? (quick ? '200,1000' : '1000,10000')),
    ttfhSamples: num('ttfh-samples', quick ? 5 : 10),
    install: !flags.has('--no-install'),
    docs: flags.has('--docs') || (mode === 'full' && !flags.has('--no-docs')),
    cli: value('cli') ?? DEFAULT_CLI,
    baseCli,
    out: value('out'),
  };
}
