/**
 * `npm run bench`: the side-by-side benchmark of issue 6 (direct, nginx, the forwarder,
 * the cli-proxy), or its smoke mode. See docs/performance.md for the method and results.
 */
import { parseArgs, USAGE } from './lib/args.js';
import { installCleanup } from './lib/proc.js';
import { runBench } from './full.js';
import { runProfile } from './profile.js';
import { runSmoke } from './smoke.js';
import { runRotation } from './rotation.js';
import { runPeerCheck } from './peer-check.js';
import { runLink } from './link.js';
import { runMetricsCost } from './metrics-cost.js';
import { runAuditCost } from './audit-cost.js';
import { auditWrkMarkdown, runAuditWrk } from './audit-wrk.js';
import { runRenewBurst } from './renew-burst.js';
import { runRenewScaleCli } from './renew-scale.js';
import { runWatcherCost } from './watcher-cost.js';
import { runScale, runScalePlot } from './scale.js';
import { limitsMarkdown, runUnitLimits } from './unit-limits.js';
import { MCP_USAGE, parseMcpArgs, renderMcpMarkdown, runMcpBench } from './mcp.js';
import { installNpmPeers, NPM_PEERS_DIR } from './lib/npm-peers.js';
import { runTlsCost, tlsCostMarkdown } from './tls-cost.js';

async function main(): Promise<number> {
  const argv = process.argv.slice(2);
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(`${USAGE}\n${MCP_USAGE}\n`);
    return 0;
  }
  if (argv.includes('--install-peers')) {
    const bins = await installNpmPeers((l) => void process.stderr.write(`${l}\n`));
    process.stdout.write(`npm peers in ${NPM_PEERS_DIR}: ${JSON.stringify(bins)}\n`);
    return 0;
  }
  if (argv.includes('--mcp')) {
    installCleanup();
    const r = await runMcpBench(parseMcpArgs(argv), (l) => void process.stderr.write(`${l}\n`));
    process.stdout.write(`${renderMcpMarkdown(r)}\n`);
    return 0;
  }
  if (argv.includes('--renew-burst')) return runRenewBurst((l) => void process.stderr.write(`${l}\n`)).then((f) => (process.stdout.write(`${JSON.stringify(f, null, 2)}\n`), 0));
  if (argv.includes('--scale')) {
    installCleanup();
    return runScale((l) => void process.stderr.write(`${l}\n`), argv);
  }
  if (argv.includes('--scale-plot')) return runScalePlot(argv.slice(argv.indexOf('--scale-plot') + 1));
  if (argv.includes('--renew-scale')) {
    installCleanup();
    return runRenewScaleCli(argv, (l) => void process.stderr.write(`${l}\n`));
  }
  if (argv.includes('--watcher')) return runWatcherCost((l) => void process.stderr.write(`${l}\n`)).then((f) => (process.stdout.write(`${JSON.stringify(f, null, 2)}\n`), 0));
  if (argv.includes('--peer')) return runPeerCheck((l) => void process.stderr.write(`${l}\n`)).then((f) => (process.stdout.write(`${JSON.stringify(f, null, 2)}\n`), 0));
  if (argv.includes('--tls')) {
    installCleanup();
    const r = await runTlsCost((l) => void process.stderr.write(`${l}\n`));
    process.stdout.write(`${JSON.stringify(r, null, 2)}\n\n${tlsCostMarkdown(r)}\n`);
    return 0;
  }
  if (argv.includes('--limits')) {
    installCleanup();
    const r = await runUnitLimits((l) => void process.stderr.write(`${l}\n`));
    process.stdout.write(`${JSON.stringify(r, null, 2)}\n\n${limitsMarkdown(r)}\n`);
    return 0;
  }
  // --audit-wrk's own: where its spools go (a file system of their own, e.g. a journaled ext4).
  const spoolAt = argv.indexOf('--spool-dir');
  const spoolDir = spoolAt >= 0 ? argv[spoolAt + 1] : undefined;
  if (spoolAt >= 0) argv.splice(spoolAt, 2);
  let opts;
  try {
    opts = parseArgs(argv.filter((a) => a !== '--metrics' && a !== '--with-metrics' && a !== '--audit' && a !== '--audit-wrk' && a !== '--cpu-prof'));
  } catch (err) {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n${USAGE}\n`);
    return 2;
  }
  installCleanup();
  const log = (line: string): void => void process.stderr.write(`${line}\n`);
  if (argv.includes('--audit-wrk')) {
    const r = await runAuditWrk(opts, log, { cpuProf: argv.includes('--cpu-prof'), spoolDir });
    process.stdout.write(`${auditWrkMarkdown(r)}\n`);
    return 0;
  }
  if (argv.includes('--audit')) return runAuditCost(opts, log).then((r) => (process.stdout.write(`${JSON.stringify(r, null, 2)}\n`), 0));
  if (argv.includes('--metrics')) {
    process.stdout.write(`${JSON.stringify(await runMetricsCost(opts, log), null, 2)}\n`);
    return 0;
  }
  switch (opts.mode) {
    case 'smoke': {
      const r = await runSmoke({ cli: opts.cli, log });
      process.stdout.write(`${JSON.stringify(r, null, 2)}\n`);
      return r.ok ? 0 : 1;
    }
    case 'profile':
      await runProfile(opts, log, argv.includes('--with-metrics'));
      return 0;
    case 'rotation':
      return runRotation(log);
    case 'link':
      return runLink(log, opts.cli);
    default:
      await runBench(opts, log);
      if (opts.mode === 'full') {
        await runMetricsCost(opts, log);
        log(`watcher cost: ${JSON.stringify((await runWatcherCost(log)).medians)}`);
      }
      return opts.mode === 'full' ? runRotation(log) : 0;
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
