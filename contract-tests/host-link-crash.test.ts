import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { checkNoLeaks, type CliProc } from '../test/support/cli-proc.js';
import { until } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { handoffSlots } from './helpers/slots.js';
import { appliedLine, filesHolding, HANDED_OVER, hostWorld, killedAt, readJson, type HostWorld } from './helpers/host-link-rig.js';

/*
 * Crash safety of a state change (SPEC §8), black-box: a real enrolled link and a real
 * `renew apply --watch` against the mock Gateway. apply is SIGKILLed (by its own crash
 * point, as a power cut would) at each step of a reconcile, and the link right after
 * it wrote desired-state.json; after a restart both converge to the Gateway's state:
 * registry, catalog, slot files, token files (the dropped ones deleted, the new ones
 * renewed), shims and applied-state. A watcher reads every file a proxy, the agent or the
 * link reads (instances.json, providers.json, desired-state.json, applied-state.json, the
 * shim directory) throughout, and must never see a partial or invalid one.
 */

/** In the order reconcile passes them (src/apply/reconcile.ts): the registry and catalog, shims, slots, then what is gone. */
const APPLY_POINTS = [
  'reconcile-after-registry-write',
  'reconcile-after-catalog-write',
  'reconcile-after-shims',
  'reconcile-after-slots',
  'reconcile-after-token-deletion',
  'reconcile-after-manifest-retire',
  'reconcile-after-slot-retire',
];

// Eight kills and restarts, each two CLI start-ups and a renewal: ~50 s idle.
t.setTimeout(300_000);

const w: HostWorld = await hostWorld(t, { tokenLifetimeMs: 120_000 });
const registryPath = join(w.applyState, 'mcp-forwarder', 'instances.json');
const catalogPath = join(w.applyState, 'cli-proxy', 'providers.json');
const crashes = { apply: 0, link: 0 };

/** Reads the watched files as fast as a busy host allows, recording anything partial or invalid. */
class Watcher {
  reads = 0;
  readonly problems: string[] = [];
  /** Every shim text seen, by name; checked at the end against the rendered ones. */
  readonly shimsSeen = new Map<string, Set<string>>();
  private running = true;
  private readonly done: Promise<void>;

  constructor() {
    this.done = this.loop();
  }

  private json(path: string, check: (v: unknown) => boolean): void {
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch {
      return;
    }
    this.reads += 1;
    try {
      if (!check(JSON.parse(text))) this.problems.push(`${path}: unexpected shape`);
    } catch {
      this.problems.push(`${path}: not JSON (${text.length} bytes)`);
    }
  }

  private async loop(): Promise<void> {
    const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
    while (this.running) {
      this.json(registryPath, (v) => isObject(v) && Object.values(v).every((b) => isObject(b) && typeof b.instanceId === 'string' && typeof b.tokenFile === 'string'));
      this.json(catalogPath, (v) => isObject(v) && Object.values(v).every((p) => isObject(p) && typeof p.upstream === 'string' && Array.isArray(p.commands)));
      this.json(join(w.handoff, 'desired-state.json'), (v) => isObject(v) && typeof v.version === 'number' && isObject(v.bindings) && isObject(v.providers));
      this.json(join(w.handoff, 'applied-state.json'), (v) => isObject(v) && typeof v.version === 'number');
      let names: string[] = [];
      try {
        names = readdirSync(w.shimDir).filter((n) => !n.startsWith('.'));
      } catch {
        // Not rendered yet.
      }
      for (const name of names) {
        try {
          const text = readFileSync(join(w.shimDir, name), 'utf8');
          this.reads += 1;
          const seen = this.shimsSeen.get(name) ?? new Set<string>();
          seen.add(text);
          this.shimsSeen.set(name, seen);
        } catch {
          // Removed between the listing and the read.
        }
      }
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  async stop(): Promise<void> {
    this.running = false;
    await this.done;
  }
}

const watcher = new Watcher();
t.teardown(() => watcher.stop());
/** The complete text of every shim ever rendered, by name (read once a state is in force). */
const shimsRendered = new Map<string, string>();

const binding = (i: number) => ({ instanceId: `inst-c${i}`, upstreamUrl: `https://gw.example.com/mcp/c${i}` });
const provider = (i: number) => ({
  upstream: `https://api.example.com/c${i}`,
  inject: { type: 'header' as const, name: 'Authorization', value: 'Bearer {token}' },
  commands: [{ name: `crash${i}-cli`, env: {} }],
});

/** The Gateway's state is in force on the host: every file apply owns says so. */
async function checkConverged(tt: TapTest, gone: { slots: string[] }): Promise<void> {
  const state = w.gw.control.state();
  const wantSlots = [...Object.values(state.bindings).map((b) => `instance:${b.instanceId}`), ...Object.keys(state.providers).map((p) => `cli:${p}`)].sort();
  tt.match(readJson(join(w.handoff, 'applied-state.json')), { version: state.version, appliedAt: String }, 'the Gateway\'s version in force');
  tt.same(Object.keys(readJson(registryPath)).sort(), Object.keys(state.bindings).sort(), 'registry: exactly the Gateway\'s bindings');
  tt.same(Object.keys(readJson(catalogPath)).sort(), Object.keys(state.providers).sort(), 'catalog: exactly the Gateway\'s providers');
  tt.same(handoffSlots(w.handoff), wantSlots, 'slots (manifest and per-slot files): exactly the state\'s slots');
  const tokenFile = (slot: string) => (slot.startsWith('instance:') ? w.instanceToken(slot.slice(9)) : w.providerToken(slot.slice(4)));
  for (const slot of wantSlots) await until(() => existsSync(tokenFile(slot)), `a renewed token for ${slot}`, 20_000);
  tt.pass('every slot of the state has its renewed token file');
  for (const slot of gone.slots) tt.notOk(existsSync(tokenFile(slot)), `${slot}: token file deleted`);
  const goneTokens = gone.slots.flatMap((s) => [...(w.minted.get(s) ?? [])]);
  tt.same(filesHolding(w.root, goneTokens), [], 'no file anywhere holds a dropped slot\'s token');
  const wantShims = Object.values(state.providers).flatMap((p) => p.commands.map((c) => c.name)).sort();
  tt.same(readdirSync(w.shimDir).filter((n) => !n.startsWith('.')).sort(), wantShims, 'shims: exactly the state\'s commands');
  for (const name of wantShims) shimsRendered.set(name, readFileSync(join(w.shimDir, name), 'utf8'));
}

let link: CliProc;
let apply: CliProc;
let n = 0;

t.test('v1 in force: one binding, one provider, tokens renewed', async (t) => {
  apply = w.startApply();
  await apply.waitForLog((l) => l.msg === 'apply watching', 15_000);
  link = w.startLink();
  w.gw.control.connectBinding(`bind_crash_${n}`, binding(n));
  w.gw.control.connectProvider(`crash${n}`, provider(n));
  await apply.waitForLog(appliedLine(w.gw.control.version), 15_000);
  await checkConverged(t, { slots: [] });
});

for (const point of APPLY_POINTS) {
  t.test(`apply SIGKILLed at ${point} converges after a restart`, async (t) => {
    await apply.stop('SIGTERM');
    const crashing = w.startApply({ AGENT_CONNECTORS_TEST_HOOKS: `crash:${point}` });
    await crashing.waitForLog((l) => l.msg === 'apply watching', 15_000);
    // One change that needs every step: a binding and a provider replaced.
    const old = n;
    n += 1;
    w.gw.control.disconnectBinding(`bind_crash_${old}`);
    w.gw.control.disconnectProvider(`crash${old}`);
    w.gw.control.connectBinding(`bind_crash_${n}`, binding(n));
    w.gw.control.connectProvider(`crash${n}`, provider(n));
    const exit = await killedAt(crashing, `apply killed at ${point}`);
    t.equal(exit.signal, 'SIGKILL', `killed at ${point}`);
    crashes.apply += 1;
    t.notMatch(readJson(join(w.handoff, 'applied-state.json')), { version: w.gw.control.version }, 'the new version is not in force yet');

    apply = w.startApply();
    await apply.waitForLog(appliedLine(w.gw.control.version), 15_000);
    await checkConverged(t, { slots: [`instance:inst-c${old}`, `cli:crash${old}`] });
  });
}

t.test('the link SIGKILLed right after writing desired-state.json converges after a restart, with a change made while it was down', async (t) => {
  await link.stop('SIGTERM');
  const crashing = w.startLink({ AGENT_CONNECTORS_TEST_HOOKS: 'crash:link-after-desired-state-write' });
  await crashing.waitForLog((l) => l.msg === 'state poller started from the handed-over version', 15_000);
  const old = n;
  n += 1;
  w.gw.control.disconnectBinding(`bind_crash_${old}`);
  w.gw.control.connectBinding(`bind_crash_${n}`, binding(n));
  const written = w.gw.control.version;
  const exit = await killedAt(crashing, 'the link killed after the hand-over');
  t.equal(exit.signal, 'SIGKILL', 'killed right after writing desired-state.json');
  crashes.link += 1;
  t.equal(readJson(join(w.handoff, 'desired-state.json')).version, written, 'the state it wrote is whole');
  await apply.waitForLog(appliedLine(written), 15_000);
  // Changed while the link is down: the restarted link must fetch it.
  w.gw.control.disconnectProvider(`crash${old}`);
  w.gw.control.connectProvider(`crash${n}`, provider(n));
  link = w.startLink();
  await link.waitForLog((l) => l.msg === HANDED_OVER && l.version === w.gw.control.version, 15_000);
  await apply.waitForLog(appliedLine(w.gw.control.version), 15_000);
  await checkConverged(t, { slots: [`instance:inst-c${old}`, `cli:crash${old}`] });
});

t.test('the watcher never saw a partial or invalid file', async (t) => {
  await watcher.stop();
  t.ok(watcher.reads > 100, `the watcher read the files throughout (${watcher.reads} reads)`);
  t.same(watcher.problems, [], 'every registry, catalog, desired and applied state read was whole');
  for (const [name, texts] of watcher.shimsSeen) {
    t.same([...texts], [shimsRendered.get(name)], `shim ${name}: only ever seen whole`);
  }
  t.ok(watcher.shimsSeen.size >= APPLY_POINTS.length, 'shims of each state were seen');
  t.comment(`FIGURES host-link-crash ${JSON.stringify({ ...crashes, watcherReads: watcher.reads })}`);
});

checkNoLeaks(t);
