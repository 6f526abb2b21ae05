import t from 'tap';
import { toLocalConfig } from '../../src/data/desired-state.js';
import { stateLayout } from '../../src/data/state-layout.js';
import { tokenPath } from '../../src/data/token-path.js';

const layout = stateLayout('/s');

t.test('the layout default unless the entry names a file', async (t) => {
  t.equal(tokenPath({ kind: 'instance', id: 'inst-1' }, layout), '/s/mcp-forwarder/inst-1.token');
  t.equal(tokenPath({ kind: 'cli', id: 'notion' }, layout), '/s/cli-proxy/notion.token');
  t.equal(tokenPath({ kind: 'instance', id: 'inst-1' }, layout, '/srv/custom.token'), '/srv/custom.token');
  t.equal(tokenPath({ kind: 'cli', id: 'notion' }, layout, '/srv/notion.token'), '/srv/notion.token');
});

t.test('a desired state becomes local config with the same paths', async (t) => {
  const { instances, catalog } = toLocalConfig(
    {
      version: 1,
      bindings: { bindAAAAAAAA: { instanceId: 'inst-1', upstreamUrl: 'https://gw.example/mcp' } },
      providers: { notion: { upstream: 'https://api.notion.com', inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' }, commands: [] } },
    },
    layout,
  );
  t.equal(instances.bindAAAAAAAA?.tokenFile, tokenPath({ kind: 'instance', id: 'inst-1' }, layout));
  t.equal(catalog.notion?.tokenFile, tokenPath({ kind: 'cli', id: 'notion' }, layout));
});
