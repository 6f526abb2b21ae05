import t from 'tap';
import { configText } from '../../src/apply/config-text.js';
import { toLocalConfig, type DesiredState } from '../../src/data/desired-state.js';
import { stateLayout } from '../../src/data/state-layout.js';

const pretty = (v: unknown): string => `${JSON.stringify(v, null, 2)}\n`;

t.test('configText is JSON.stringify(value, null, 2) byte for byte', async (t) => {
  const cases: unknown[] = [
    {},
    { a: {} },
    { a: { b: [] }, c: { d: [1, { e: 'x\ny' }], f: null, g: undefined } },
    { 'ü\n"k': { 'tab\t': 'quote " and \\ and \u2028' } },
    { 10: { n: 1 }, 2: { n: 2 }, z: { n: 3 } },
    { a: 1, b: 'not an object entry' },
    { a: [1, 2] },
    { a: new Date(0) },
    [],
    null,
  ];
  // By index: a raw U+2028 in a message would break the TAP line.
  cases.forEach((c, i) => t.equal(configText(c), pretty(c), `case ${i}`));
  const shared = { instanceId: 'i', tokenFile: '/t' };
  for (const c of [{ a: shared }, { b: shared }, { a: shared, b: shared }]) t.equal(configText(c), pretty(c), 'one entry object under another key');
});

t.test('a registry made by toLocalConfig: the same bytes across states that reuse entries', async (t) => {
  const layout = stateLayout('/var/lib/agent-connectors');
  const bindings: DesiredState['bindings'] = {};
  for (let i = 0; i < 50; i++) bindings[`binding-${String(i).padStart(4, '0')}`] = { instanceId: `inst-${i % 7}`, upstreamUrl: `https://gw.example/i/${i}/mcp` };
  const first: DesiredState = { version: 1, bindings, providers: { notion: { upstream: 'https://api.notion.com', inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [] } } as unknown as DesiredState['providers'] };
  const a = toLocalConfig(first, layout);
  t.equal(configText(a.instances), pretty(a.instances), 'first');
  t.equal(configText(a.catalog), pretty(a.catalog), 'catalog');
  const { 'binding-0003': _gone, ...rest } = bindings;
  const second: DesiredState = { ...first, version: 2, bindings: { ...rest, 'binding-9999': { instanceId: 'inst-new', upstreamUrl: 'https://gw.example/new' } } };
  const b = toLocalConfig(second, layout);
  t.equal(b.instances['binding-0004'], a.instances['binding-0004'], 'the unchanged entry is the same object');
  t.equal(configText(b.instances), pretty(b.instances), 'second, with reused entries');
  t.equal(configText(a.instances), pretty(a.instances), 'the first again');
});
