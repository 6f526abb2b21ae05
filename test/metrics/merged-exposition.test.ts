import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import t from 'tap';
import { createLinkMetrics } from '../../src/metrics/link-metrics.js';
import { mergedExposition } from '../../src/metrics/merged-exposition.js';
import { processRegistry } from '../../src/metrics/process-metrics.js';
import { createApplyMetrics, createRenewalMetrics } from '../../src/metrics/renewal-metrics.js';

interface Parsed {
  /** Family name → its TYPE, in the order the families appear. */
  types: Map<string, string>;
  samples: string[];
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$/;
const SUFFIXES: Record<string, readonly string[]> = { histogram: ['_bucket', '_sum', '_count'], summary: ['_sum', '_count', ''] };

/**
 * A strict reading of the text format (Prometheus exposition 0.0.4): each family's HELP
 * and TYPE at most once and before its samples, every sample under the family it belongs
 * to, no family split in two. Throws on the first violation.
 */
function parseStrict(text: string): Parsed {
  const types = new Map<string, string>();
  const helps = new Set<string>();
  const closed = new Set<string>();
  const samples: string[] = [];
  let current: string | undefined;
  const enter = (name: string): void => {
    if (name === current) return;
    if (closed.has(name)) throw new Error(`family ${name} appears twice`);
    if (current) closed.add(current);
    current = name;
  };
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const meta = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
    if (meta) {
      const name = meta[2] as string;
      enter(name);
      if (meta[1] === 'HELP') {
        if (helps.has(name)) throw new Error(`two # HELP for ${name}`);
        helps.add(name);
      } else {
        if (types.has(name)) throw new Error(`two # TYPE for ${name}`);
        if (samples.some((s) => s.startsWith(`${name}{`) || s.startsWith(`${name} `))) throw new Error(`# TYPE ${name} after its samples`);
        types.set(name, meta[3] ?? '');
      }
      continue;
    }
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`unparseable line: ${line}`);
    const name = m[1] as string;
    if (Number.isNaN(Number(m[3])) && m[3] !== 'NaN') throw new Error(`not a number: ${line}`);
    const family = current && (name === current || (SUFFIXES[types.get(current) ?? ''] ?? []).some((s) => name === current + s)) ? current : undefined;
    if (!family) throw new Error(`sample ${name} outside its family (under ${current ?? 'nothing'})`);
    samples.push(line);
  }
  return { types, samples };
}

/** A part-like registry: the same metric names in each, its own default `part`. */
function partRegistry(part: string, n: number): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part });
  const registers = [registry];
  new Counter({ name: 'requests_total', help: 'Requests.', labelNames: ['route'] as const, registers }).inc({ route: 'mcp' }, n);
  new Histogram({ name: 'duration_seconds', help: 'Duration.', buckets: [0.1, 1], registers }).observe(n / 10);
  new Gauge({ name: 'open_streams', help: 'Open streams.', registers }).set(n);
  new Gauge({ name: 'by_state', help: 'Labelled, never set: a family with no samples.', labelNames: ['state'] as const, registers });
  return registry;
}

t.test('several registries with the same names render as one valid exposition, every sample kept with its part', async (t) => {
  const registries = [partRegistry('forwarder', 3), partRegistry('cli-proxy', 5)];
  const only = new Registry();
  only.setDefaultLabels({ part: 'link' });
  new Counter({ name: 'polls_total', help: 'Polls.', registers: [only] }).inc(7);
  registries.push(only);

  const merged = mergedExposition(registries);
  t.equal(merged.contentType, registries[0]?.contentType);
  const text = await merged.metrics();
  const out = parseStrict(text);
  t.same([...out.types.keys()], ['requests_total', 'duration_seconds', 'open_streams', 'by_state', 'polls_total'], 'every family once, in first-seen order');
  t.same(Object.fromEntries(out.types), { requests_total: 'counter', duration_seconds: 'histogram', open_streams: 'gauge', by_state: 'gauge', polls_total: 'counter' });

  const inputs = (await Promise.all(registries.map((r) => r.metrics()))).flatMap((x) => parseStrict(x).samples);
  t.same([...out.samples].sort(), [...inputs].sort(), 'every sample of every registry, no other');
  t.ok(out.samples.includes('requests_total{route="mcp",part="forwarder"} 3'), 'the forwarder\'s sample keeps its part');
  t.ok(out.samples.includes('requests_total{route="mcp",part="cli-proxy"} 5'), 'the cli-proxy\'s sample keeps its part');
  t.ok(out.samples.includes('duration_seconds_count{part="cli-proxy"} 1'));
  t.ok(out.samples.includes('polls_total{part="link"} 7'));
  t.equal(text.match(/^# HELP requests_total /gm)?.length, 1, 'one # HELP for a name in two registries');

});

t.test('the plain concatenation of two registries is not a valid exposition (what the merge is for)', async (t) => {
  const texts = await Promise.all([partRegistry('forwarder', 1), partRegistry('cli-proxy', 2)].map((r) => r.metrics()));
  t.throws(() => parseStrict(texts.join('\n')), /appears twice|two # HELP/);
});

/** A part's registry as dev builds it (registry.ts, less the build info: it reads package.json). */
function devPartRegistry(part: string): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ part });
  return registry;
}

t.test("dev's registries: each part's series with its part, the process series once as part dev", async (t) => {
  const link = devPartRegistry('link');
  const apply = devPartRegistry('apply');
  createRenewalMetrics(link);
  createLinkMetrics(link).polled('state');
  createApplyMetrics(apply).applied({ applied: 2, ignored: 0, rejected: 0 });
  const text = await mergedExposition([link, apply, processRegistry('dev')]).metrics();
  const out = parseStrict(text);
  const named = (name: string): string[] => out.samples.filter((s) => s.startsWith(`${name}{`) || s.startsWith(`${name} `));
  t.equal(named('process_cpu_seconds_total').length, 1, 'CPU once for the one process');
  t.match(named('process_cpu_seconds_total')[0], /^process_cpu_seconds_total\{part="dev"\} /);
  t.ok(out.samples.includes('agent_connectors_link_state{state="synced",part="link"} 1'));
  t.ok(out.samples.includes('agent_connectors_apply_tokens_total{result="applied",part="apply"} 2'));
});

t.test('a name with two types in two registries is refused, not rendered invalid', async (t) => {
  const a = new Registry();
  const b = new Registry();
  new Counter({ name: 'clash', help: 'c', registers: [a] });
  new Gauge({ name: 'clash', help: 'g', registers: [b] });
  await t.rejects(mergedExposition([a, b]).metrics(), /metric clash has two types/);
  t.throws(() => mergedExposition([]), /at least one registry/);
});
