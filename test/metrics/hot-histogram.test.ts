import { Histogram, Registry } from 'prom-client';
import t from 'tap';
import { HotHistogram } from '../../src/metrics/hot-histogram.js';

const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 1];
const LABELS = ['route', 'code'] as const;

// Values on and between the bounds, below the first and above the last.
const OBSERVATIONS: [string, string, number][] = [
  ['mcp', '200', 0.001],
  ['mcp', '200', 0.005],
  ['mcp', '200', 0.0051],
  ['mcp', '200', 0.7],
  ['mcp', '502', 3],
  ['provider', '200', 0.05],
  ['provider', '200', 0.05],
  ['mcp', '200', 0.01],
];

function registries(): { theirs: Registry; ours: Registry; hot: HotHistogram<(typeof LABELS)[number]> } {
  const theirs = new Registry();
  const ours = new Registry();
  for (const r of [theirs, ours]) r.setDefaultLabels({ part: 'forwarder' });
  const reference = new Histogram({ name: 'req_seconds', help: 'Requests.', labelNames: LABELS, buckets: BUCKETS, registers: [theirs] });
  const hot = new HotHistogram({ name: 'req_seconds', help: 'Requests.', labelNames: LABELS, buckets: BUCKETS, registers: [ours] });
  for (const [route, code, seconds] of OBSERVATIONS) {
    reference.observe({ route, code }, seconds);
    const key = (route === 'mcp' ? 0 : 1) * 1000 + Number(code);
    hot.record(hot.seriesAt(key) ?? hot.addSeries(key, { route, code }), seconds);
  }
  return { theirs, ours, hot };
}

t.test("the exposition is prom-client's own, line for line", async (t) => {
  const { theirs, ours } = registries();
  const expected = await theirs.metrics();
  t.match(expected, /req_seconds_bucket\{le="0.005",part="forwarder",route="mcp",code="200"\} 2/, 'the reference renders what is asserted below');
  t.equal(await ours.metrics(), expected);
  const samples = async (r: Registry): Promise<unknown> =>
    (await r.getMetricsAsJSON()).map((m) => ({ name: m.name, help: m.help, type: m.type, values: m.values.map((v) => ({ metricName: 'metricName' in v ? v.metricName : undefined, labels: v.labels, value: v.value })) }));
  t.same(await samples(ours), await samples(theirs), 'and the JSON form');
});

t.test("prom-client's own ways in are refused, not counted where no scrape looks", async (t) => {
  const { theirs, ours, hot } = registries();
  const before = await ours.metrics();
  t.throws(() => (hot as Histogram<(typeof LABELS)[number]>).observe({ route: 'mcp', code: '200' }, 0.02), /use seriesAt\(\)\/addSeries\(\) and record\(\)/);
  t.throws(() => hot.labels(), /use seriesAt\(\)\/addSeries\(\) and record\(\)/);
  t.throws(() => hot.startTimer(), /use seriesAt\(\)\/addSeries\(\) and record\(\)/);
  t.equal(await ours.metrics(), before, 'nothing changed');
  t.equal(before, await theirs.metrics());
});

t.test('reset forgets every series', async (t) => {
  const { ours, hot } = registries();
  hot.reset();
  t.equal(await ours.metrics(), '# HELP req_seconds Requests.\n# TYPE req_seconds histogram\n');
});
