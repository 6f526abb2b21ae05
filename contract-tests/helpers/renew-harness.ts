import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { knownSecrets, startCli, type CliProc, type Exit } from '../../test/support/cli-proc.js';
import { MockRenewGateway, type MockRenewGatewayOptions } from '../../test/support/mock-renew-gateway.js';
import { within } from '../../test/support/poll.js';
import type { TapTest } from '../../test/support/tap.js';
import { tempDir } from '../../test/support/temp-dir.js';

/**
 * A black-box rig for the renewal pair: one MockRenewGateway, a hand-off directory, a
 * private state root for `renew fetch` and a separate state root for `renew apply` (as on
 * a host, where they are different users' directories), and the host credential file.
 * Every gateway, process and directory is remembered for the file's closing checks.
 */

export const CREDENTIAL = 'host-cred-RIGHT-7f3a9c2e5b1d';
export const WRONG_CREDENTIAL = 'host-cred-WRONG-0d8e4a6c2f9b';

/** Everything this file started, for the leak sweep and the FIGURES line. */
export const allGateways: MockRenewGateway[] = [];
export const allRigs: RenewRig[] = [];
/** SIGKILLs injected into fetch (crash hooks and kills from the test). */
export const crashes = { count: 0 };

export interface SlotFileJson {
  slot: string;
  tokenId: string | null;
  expiresAt: string | null;
  generation: number;
  appliedAt?: string | null;
  revoked?: boolean;
}

export interface InboxOk {
  slot: string;
  tokenId: string;
  token: string;
  expiresAt: string;
  credentialGeneration: number;
}

export interface PrivateState {
  slot: string;
  pending?: { requestId: string; expectedTokenId: string | null; since: string };
  delivered?: { tokenId: string; expiresAt: string; generation: number; receivedAt: string };
  adopted?: string | null;
}

export class RenewRig {
  readonly handoff = tempDir('ac-renew-handoff-');
  readonly fetchState = tempDir('ac-renew-fetch-');
  readonly applyState = tempDir('ac-renew-apply-');
  readonly credentialFile: string;
  readonly procs: CliProc[] = [];

  constructor(
    private readonly t: TapTest,
    readonly gw: MockRenewGateway,
  ) {
    mkdirSync(join(this.handoff, 'slots'), { recursive: true });
    mkdirSync(join(this.handoff, 'inbox'), { recursive: true });
    this.credentialFile = join(tempDir('ac-renew-cred-'), 'host-credential');
    this.setCredential(CREDENTIAL);
  }

  /** Replaces the credential file atomically (as systemd or an operator would). */
  setCredential(credential: string): void {
    knownSecrets.add(credential);
    const tmp = `${this.credentialFile}.tmp`;
    writeFileSync(tmp, `${credential}\n`, { mode: 0o600 });
    renameSync(tmp, this.credentialFile);
  }

  /** A slot as `bind` leaves it (no token yet), known to the Gateway unless told otherwise. */
  addSlot(slot: string, onGateway = true): void {
    const file: SlotFileJson = { slot, tokenId: null, expiresAt: null, generation: 0 };
    const path = join(this.handoff, 'slots', `${slot}.json`);
    writeFileSync(`${path}.tmp`, `${JSON.stringify(file)}\n`, { mode: 0o640 });
    renameSync(`${path}.tmp`, path);
    if (onGateway) this.gw.createSlot(slot);
  }

  fetchArgs(extra: string[] = []): string[] {
    return [
      'renew',
      'fetch',
      '--gateway',
      this.gw.url,
      '--credential',
      this.credentialFile,
      '--handoff',
      this.handoff,
      '--state-dir',
      this.fetchState,
      '--log-level',
      'trace',
      ...extra,
    ];
  }

  /** Starts `renew fetch` (loop mode unless `--once` is among `extra`). */
  startFetch(extra: string[] = [], env: NodeJS.ProcessEnv = {}): CliProc {
    const proc = startCli(this.fetchArgs(extra), env);
    this.procs.push(proc);
    this.t.teardown(async () => {
      await proc.stop('SIGKILL');
    });
    return proc;
  }

  /** Runs `renew fetch --once` to its end. */
  async fetchOnce(extra: string[] = [], env: NodeJS.ProcessEnv = {}, timeoutMs = 15_000): Promise<{ proc: CliProc; exit: Exit }> {
    const proc = this.startFetch(['--once', ...extra], env);
    const exit = await within(proc.exited, timeoutMs, `renew fetch --once ${extra.join(' ')}`);
    this.harvest();
    return { proc, exit };
  }

  /** Runs fetch with a crash hook and waits for it to die of its own SIGKILL. */
  async fetchCrash(hook: string, extra: string[] = []): Promise<{ proc: CliProc; exit: Exit }> {
    const proc = this.startFetch(['--once', ...extra], { AGENT_CONNECTORS_TEST_HOOKS: `crash:${hook}` });
    const exit = await within(proc.exited, 15_000, `fetch with crash:${hook} to die`);
    if (exit.signal === 'SIGKILL') crashes.count += 1;
    this.harvest();
    return { proc, exit };
  }

  /** Runs `renew apply` once to its end. */
  async apply(): Promise<{ proc: CliProc; exit: Exit }> {
    this.harvest();
    const proc = startCli(['renew', 'apply', '--handoff', this.handoff, '--state-dir', this.applyState, '--log-level', 'trace']);
    this.procs.push(proc);
    this.t.teardown(async () => {
      await proc.stop('SIGKILL');
    });
    const exit = await within(proc.exited, 15_000, 'renew apply');
    this.harvest();
    return { proc, exit };
  }

  /**
   * The inbox file holding the newest answer for `slot`: the newest batch file (names sort
   * in write order) with an entry for it, else a per-slot file (what a link before the
   * batches wrote; the path even when absent).
   */
  inboxPath(slot: string): string {
    const dir = join(this.handoff, 'inbox');
    for (const name of this.inboxNames().filter((n) => n.startsWith('batch-')).sort().reverse()) {
      if (this.batchEntries(name)?.some((e) => (e as { slot?: unknown }).slot === slot)) return join(dir, name);
    }
    return join(dir, `${slot}.json`);
  }

  inboxNames(): string[] {
    return readdirSync(join(this.handoff, 'inbox'));
  }

  /** A batch file's entries as written (undefined when gone: apply took it meanwhile). */
  batchEntries(name: string): unknown[] | undefined {
    let text: string;
    try {
      text = readFileSync(join(this.handoff, 'inbox', name), 'utf8');
    } catch {
      return undefined;
    }
    return (JSON.parse(text) as { v: 1; entries: unknown[] }).entries;
  }

  /** The newest answer for `slot` in the inbox, whichever file holds it. */
  readInbox(slot: string): InboxOk | { slot: string; revoked: true; at: string } | undefined {
    const p = this.inboxPath(slot);
    if (!existsSync(p)) return undefined;
    const name = p.slice(p.lastIndexOf('/') + 1);
    if (!name.startsWith('batch-')) return JSON.parse(readFileSync(p, 'utf8')) as InboxOk | { slot: string; revoked: true; at: string };
    const mine = (this.batchEntries(name) ?? []).filter((e) => (e as { slot?: unknown }).slot === slot);
    return mine[mine.length - 1] as InboxOk | { slot: string; revoked: true; at: string } | undefined;
  }

  readSlot(slot: string): SlotFileJson {
    return JSON.parse(readFileSync(join(this.handoff, 'slots', `${slot}.json`), 'utf8')) as SlotFileJson;
  }

  /** The link's record directory: its renewal ledger (`ledger.snapshot`, `ledger-<n>.log`). */
  privateStateDir(): string {
    return join(this.fetchState, 'link', 'slots');
  }

  /**
   * The slot's record as the link's ledger holds it on disk, read here on its own terms
   * (not with the link's reader): the snapshot's records, then each log from the one its
   * header names, in order; a line naming `forgotten` removes the record; a line that is not
   * whole JSON (a torn last line) is ignored.
   */
  readPrivate(slot: string): PrivateState | undefined {
    return readLedger(this.privateStateDir()).get(slot);
  }
  /** The §2 default token file apply writes for `instance:<id>` (no registry here). */
  tokenFile(slot: string): string {
    const id = slot.slice(slot.indexOf(':') + 1);
    return slot.startsWith('instance:') ? join(this.applyState, 'mcp-forwarder', `${id}.token`) : join(this.applyState, 'cli-proxy', `${id}.token`);
  }

  readToken(slot: string): string | undefined {
    const p = this.tokenFile(slot);
    return existsSync(p) ? readFileSync(p, 'utf8').trim() : undefined;
  }

  /**
   * Every token that reached this host (inbox files, token files) becomes a known secret,
   * so the leak checks search for it. The mock never hands out its tokens otherwise.
   */
  harvest(): void {
    for (const dir of [join(this.handoff, 'inbox'), join(this.handoff, 'rejected')]) {
      for (const name of safeReaddir(dir)) {
        const text = safeRead(join(dir, name));
        if (text === undefined) continue;
        for (const m of text.matchAll(/"token":"([^"]+)"/g)) if (m[1]) knownSecrets.add(m[1]);
      }
    }
    for (const dir of [join(this.applyState, 'mcp-forwarder'), join(this.applyState, 'cli-proxy')]) {
      for (const name of safeReaddir(dir)) {
        if (!name.endsWith('.token')) continue;
        const text = safeRead(join(dir, name))?.trim();
        if (text) knownSecrets.add(text);
      }
    }
  }

  /** Files that must never hold a secret: slots/ and fetch's private state. */
  secretFreeFiles(): string[] {
    return [...walk(join(this.handoff, 'slots')), ...walk(join(this.fetchState, 'link'))];
  }
}

export async function makeRig(t: TapTest, options: MockRenewGatewayOptions = {}): Promise<RenewRig> {
  const gw = await MockRenewGateway.start({ credential: CREDENTIAL, ...options });
  allGateways.push(gw);
  t.teardown(() => gw.close());
  const rig = new RenewRig(t, gw);
  allRigs.push(rig);
  return rig;
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

function safeRead(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const name of safeReaddir(dir)) {
    const p = join(dir, name);
    const st = statSync(p, { throwIfNoEntry: false });
    if (!st) continue;
    if (st.isDirectory()) out.push(...walk(p));
    else if (st.isFile()) out.push(p);
  }
  return out;
}

/** Totals across every gateway of the file, for the closing FIGURES line. */
export function figures(renewedTokenIds: ReadonlySet<string>): {
  renewalsAttempted: number;
  faultsInjected: number;
  gatewayFaults: number;
  crashes: number;
  tokensMinted: number;
  tokensHandedToApply: number;
  duplicates: number;
} {
  const renewalsAttempted = allGateways.reduce((n, g) => n + g.requests.length, 0);
  const gatewayFaults = allGateways.reduce((n, g) => n + g.totalFaultsFired(), 0);
  const tokensMinted = allGateways.reduce((n, g) => n + g.minted(), 0);
  // A duplicate is a token the Gateway minted by a renewal that never reached apply: one
  // renewal (one requestId) must mint exactly one token, which fetch hands over.
  const tokensHandedToApply = renewedTokenIds.size;
  return {
    renewalsAttempted,
    faultsInjected: gatewayFaults + crashes.count,
    gatewayFaults,
    crashes: crashes.count,
    tokensMinted,
    tokensHandedToApply,
    duplicates: Math.max(0, tokensMinted - tokensHandedToApply),
  };
}

/** The records a renewal ledger directory holds (see `RenewRig.readPrivate`). */
export function readLedger(dir: string): Map<string, PrivateState> {
  const records = new Map<string, PrivateState>();
  const names = safeReaddir(dir);
  let from = 0;
  const apply = (line: string): void => {
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      return;
    }
    if (typeof value !== 'object' || value === null || typeof (value as { slot?: unknown }).slot !== 'string') return;
    const record = value as PrivateState & { forgotten?: true };
    if (record.forgotten === true) records.delete(record.slot);
    else records.set(record.slot, record);
  };
  if (names.includes('ledger.snapshot')) {
    const [header, ...lines] = (safeRead(join(dir, 'ledger.snapshot')) ?? '').split('\n');
    from = (JSON.parse(header ?? '{}') as { log?: number }).log ?? 0;
    for (const line of lines) apply(line);
  }
  const logs = names.flatMap((n) => /^ledger-(\d+)\.log$/.exec(n)?.[1] ?? []).map(Number).filter((n) => n >= from).sort((a, b) => a - b);
  for (const n of logs) for (const line of (safeRead(join(dir, `ledger-${n}.log`)) ?? '').split('\n')) apply(line);
  return records;
}
