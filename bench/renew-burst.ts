/**
 * `npm run bench -- --renew-burst`: how fast `renew fetch` gives new slots their first
 * token (docs/host-link.md, "renewals of new slots"), at `--renew-concurrency` 1 and 8.
 *
 * The built CLI's `renew fetch --once` over N slots that hold no token yet, against the
 * mock renewal Gateway in this process (a real RenewAuthority, loopback HTTP); from its
 * start until it exits with every slot handed to apply. apply is not run: this is fetch's
 * own rate (the link bench measures both).
 */
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { MockRenewGateway } from '../test/support/mock-renew-gateway.js';
import { DEFAULT_CLI } from './lib/paths.js';
import { spawnTracked } from './lib/proc.js';

export interface RenewBurstFigure {
  concurrency: number;
  slots: number;
  seconds: number;
  perSecond: number;
  loadavg1AtStart: number;
}

async function burst(cli: string, slots: number, concurrency: number): Promise<RenewBurstFigure> {
  const dir = mkdtempSync(join(tmpdir(), 'ac-bench-renew-burst-'));
  const credential = `hostcred-bench-${Math.random().toString(36).slice(2)}${Date.now()}`;
  const gw = await MockRenewGateway.start({ credential, tokenLifetimeMs: 6 * 3600_000 });
  try {
    const handoff = join(dir, 'handoff');
    for (const d of ['slots', 'inbox']) mkdirSync(join(handoff, d), { recursive: true });
    writeFileSync(join(dir, 'credential'), `${credential}\n`, { mode: 0o600 });
    for (let i = 0; i < slots; i++) {
      const slot = `instance:burst-${i}`;
      writeFileSync(join(handoff, 'slots', `${slot}.json`), `${JSON.stringify({ slot, tokenId: null, expiresAt: null, generation: 0 })}\n`);
      gw.createSlot(slot);
    }
    const load = loadavg()[0] ?? NaN;
    const t0 = performance.now();
    // prettier-ignore
    const child = spawnTracked(process.execPath, [
      cli, 'renew', 'fetch', '--once', '--gateway', gw.url, '--credential', join(dir, 'credential'), '--handoff', handoff,
      '--state-dir', join(dir, 'state'), '--log-level', 'warn', '--renew-concurrency', String(concurrency), '--once-budget-ms', '3600000',
    ], { stdio: ['ignore', 'ignore', 'inherit'] });
    const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    const seconds = (performance.now() - t0) / 1000;
    // Answers handed over: the entries of the batch files (a previous build's per-slot files count one each).
    const handed = readdirSync(join(handoff, 'inbox'))
      .filter((f) => !f.startsWith('.'))
      .reduce((n, f) => n + (f.startsWith('batch-') ? (JSON.parse(readFileSync(join(handoff, 'inbox', f), 'utf8')) as { entries: unknown[] }).entries.length : 1), 0);
    if (code !== 0 || handed !== slots) throw new Error(`renew fetch --once exited ${String(code)} with ${handed}/${slots} slots handed over`);
    return { concurrency, slots, seconds: Math.round(seconds * 10) / 10, perSecond: Math.round((slots / seconds) * 10) / 10, loadavg1AtStart: load };
  } finally {
    await gw.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Alternates the two settings (twice each) so a change in the machine's load hits both. */
export async function runRenewBurst(log: (line: string) => void, opts: { cli?: string; slots?: number } = {}): Promise<RenewBurstFigure[]> {
  const out: RenewBurstFigure[] = [];
  for (const concurrency of [1, 8, 1, 8]) {
    log(`renew burst: ${opts.slots ?? 2_000} new slots at --renew-concurrency ${concurrency}`);
    out.push(await burst(opts.cli ?? DEFAULT_CLI, opts.slots ?? 2_000, concurrency));
  }
  return out;
}
