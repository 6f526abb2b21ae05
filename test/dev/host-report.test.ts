import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { describeChange, EMPTY_VIEW, readHostView, settled } from '../../src/dev/host-report.js';
import { tempDir } from '../support/temp-dir.js';

/** dev's narration from what apply wrote: served = listed and its token file present. */

t.test('the view and the lines: served, disconnected (token deleted), token missing', async (t) => {
  const root = tempDir('ac-host-report-', t);
  const handoffDir = join(root, 'handoff');
  const instancesPath = join(root, 'instances.json');
  const providersPath = join(root, 'providers.json');
  mkdirSync(handoffDir);
  const token = join(root, 'sandbox.token');
  const id = 'demo_abcdefghijklmnop';
  const config = { handoffDir, instancesPath, providersPath };
  const names = { nameOf: (b: string) => (b === id ? 'sandbox' : undefined), forwarderBase: () => 'http://127.0.0.1:1', cliProxyBase: () => 'http://127.0.0.1:2' };
  const applied = (version: number): void => writeFileSync(join(handoffDir, 'applied-state.json'), JSON.stringify({ version, appliedAt: new Date().toISOString() }));

  writeFileSync(instancesPath, JSON.stringify({ [id]: { instanceId: 'sandbox', upstreamUrl: 'http://127.0.0.1:3/mcp', tokenFile: token } }));
  applied(4);
  const listed = await readHostView(config);
  t.same(describeChange(EMPTY_VIEW, listed, names), ['host: desired state version 4 applied'], 'listed without a token: not served yet');

  writeFileSync(token, 'tok\n', { mode: 0o600 });
  const served = await readHostView(config);
  t.same(describeChange(listed, served, names), [`host: binding sandbox now served at http://127.0.0.1:1/i/${id}/mcp`]);

  rmSync(token);
  const unserved = await readHostView(config);
  t.match(describeChange(served, unserved, names), [/binding sandbox has no token file now/], 'a token gone while listed');
  // A renewal answered 404 deleted the token first; the desired state drops the entry after.
  writeFileSync(instancesPath, '{}');
  applied(6);
  t.match(describeChange(unserved, await readHostView(config), names), [/version 6/, /binding sandbox disconnected: token file deleted \(sandbox\.token\)/], 'a disconnect in two steps is still told');
  writeFileSync(instancesPath, JSON.stringify({ [id]: { instanceId: 'sandbox', upstreamUrl: 'http://127.0.0.1:3/mcp', tokenFile: token } }));

  writeFileSync(token, 'tok\n', { mode: 0o600 });
  writeFileSync(instancesPath, '{}');
  applied(5);
  t.match(describeChange(served, await readHostView(config), names), ['host: desired state version 5 applied', /binding sandbox disconnected: token file still present/], 'says so when the file is still there');
  rmSync(token);
  t.match(describeChange(served, await readHostView(config), names), [/version 5/, /binding sandbox disconnected: token file deleted \(sandbox\.token\); its URL answers 404/]);

  const other = 'demo_zyxwvutsrqponmlk';
  t.match(describeChange({ ...served, bindings: new Map([[other, token]]) }, await readHostView(config), names), [/version/, /binding demo…/], 'an unknown id shows only a prefix');
});

t.test('a look in the middle of apply\'s pass (registry written, token file not yet deleted) tells the disconnect once, as the pass left it', async (t) => {
  const root = tempDir('ac-host-report-mid-', t);
  const handoffDir = join(root, 'handoff');
  const instancesPath = join(root, 'instances.json');
  mkdirSync(handoffDir);
  const token = join(root, 'demo.token');
  const id = 'demo_abcdefghijklmnop';
  const config = { handoffDir, instancesPath, providersPath: join(root, 'providers.json') };
  const names = { nameOf: () => 'demo', forwarderBase: () => 'http://127.0.0.1:1', cliProxyBase: () => 'http://127.0.0.1:2' };
  const applied = (version: number): void => writeFileSync(join(handoffDir, 'applied-state.json'), JSON.stringify({ version, appliedAt: new Date().toISOString() }));
  writeFileSync(instancesPath, JSON.stringify({ [id]: { instanceId: 'demo', upstreamUrl: 'http://127.0.0.1:3/mcp', tokenFile: token } }));
  writeFileSync(token, 'tok\n', { mode: 0o600 });
  applied(4);
  const served = await readHostView(config);

  // apply's pass for version 5, step 2: the registry is written; the token is still there.
  writeFileSync(instancesPath, '{}');
  const mid = settled(served, await readHostView(config));
  t.same(describeChange(served, mid, names), [], 'nothing told mid-pass');
  // Steps 3 and 5: the token deleted, applied-state.json written.
  rmSync(token);
  applied(5);
  const done = settled(mid, await readHostView(config));
  t.match(describeChange(mid, done, names), ['host: desired state version 5 applied', /binding demo disconnected: token file deleted/], 'told once the pass is done');
  t.same(describeChange(done, settled(done, await readHostView(config)), names), [], 'and only once');

  // A pass that leaves the file behind says so, once its version is in force.
  writeFileSync(instancesPath, JSON.stringify({ [id]: { instanceId: 'demo', upstreamUrl: 'http://127.0.0.1:3/mcp', tokenFile: token } }));
  writeFileSync(token, 'tok\n', { mode: 0o600 });
  applied(6);
  const again = settled(done, await readHostView(config));
  writeFileSync(instancesPath, '{}');
  applied(7);
  t.match(describeChange(again, settled(again, await readHostView(config)), names), [/version 7/, /binding demo disconnected: token file still present/]);
});
