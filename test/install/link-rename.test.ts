import { lstatSync, mkdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import t from 'tap';
import { mergeEnvText, moveOldLinkNames, type Act, type Systemctl } from '../../src/install/link-rename.js';
import { tempDir } from '../support/temp-dir.js';

/** 0.1.0's renew-fetch names moved to the link's, in a scratch root (the whole install path: systemd-units.test.ts). */

function scratch(t: { teardown: (fn: () => void) => void }): { root: string; at: (p: string) => string; done: Array<[string, string]>; act: Act } {
  const root = tempDir('ac-link-rename-');
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const done: Array<[string, string]> = [];
  return {
    root,
    at: (p) => join(root, p),
    done,
    act: async (what, path, fn) => {
      done.push([what, path]);
      await fn();
    },
  };
}

function plant(path: string, text: string, mode = 0o644): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text, { mode });
}

t.test('mergeEnvText keeps every line; a key link.env sets becomes a comment', async (t) => {
  t.equal(
    mergeEnvText('A=1\nexport B=2', 'B=old\n\n; note\nC = 3\nA=x\n'),
    'A=1\nexport B=2\n# From renew-fetch.env (agent-connectors 0.1.0), merged on upgrade; docs/packaging.md.\n# (link.env sets B above) B=old\n\n; note\nC = 3\n# (link.env sets A above) A=x\n',
  );
  t.equal(mergeEnvText('', 'A=1'), '# From renew-fetch.env (agent-connectors 0.1.0), merged on upgrade; docs/packaging.md.\nA=1\n', 'an empty link.env takes every key');
});

t.test('renew-fetch.env alone is renamed to link.env, its mode kept', async (t) => {
  const s = scratch(t);
  plant(s.at('/etc/agent-connectors/renew-fetch.env'), 'AGENT_CONNECTORS_GATEWAY_URL=https://gw\n', 0o640);
  await moveOldLinkNames({ root: s.root, act: s.act });
  t.same(s.done, [['rename env file', '/etc/agent-connectors/link.env']]);
  t.equal(readFileSync(s.at('/etc/agent-connectors/link.env'), 'utf8'), 'AGENT_CONNECTORS_GATEWAY_URL=https://gw\n');
  t.equal(statSync(s.at('/etc/agent-connectors/link.env')).mode & 0o777, 0o640);
  t.notOk(lstatSync(s.at('/etc/agent-connectors/renew-fetch.env'), { throwIfNoEntry: false }), 'the old file is gone');
});

t.test('a masked old unit leaves the link masked; an existing link state is not overwritten', async (t) => {
  const s = scratch(t);
  mkdirSync(s.at('/etc/systemd/system'), { recursive: true });
  symlinkSync('/dev/null', s.at('/etc/systemd/system/agent-connectors-renew-fetch.service'));
  plant(s.at('/var/lib/private/agent-connectors-renew-fetch/a'), 'old\n');
  plant(s.at('/var/lib/private/agent-connectors-link/a'), 'new\n');
  await moveOldLinkNames({ root: s.root, act: s.act });
  t.equal(readlinkSync(s.at('/etc/systemd/system/agent-connectors-link.service')), '/dev/null', 'masked');
  t.notOk(lstatSync(s.at('/etc/systemd/system/agent-connectors-renew-fetch.service'), { throwIfNoEntry: false }), 'the old mask is gone');
  t.equal(readFileSync(s.at('/var/lib/private/agent-connectors-link/a'), 'utf8'), 'new\n', "the link's own state wins");
  t.equal(readFileSync(s.at('/var/lib/private/agent-connectors-renew-fetch/a'), 'utf8'), 'old\n', 'the old one is left for the operator');
});

t.test('a running old unit is stopped before anything moves, and the link is to be started', async (t) => {
  const s = scratch(t);
  plant(s.at('/var/lib/private/agent-connectors-renew-fetch/a'), 'old\n');
  const calls: string[] = [];
  const systemctl: Systemctl = async (args) => {
    calls.push(args.join(' '));
    // The state must still be in place when stop is asked for.
    if (args[0] === 'stop') t.ok(lstatSync(s.at('/var/lib/private/agent-connectors-renew-fetch'), { throwIfNoEntry: false }), 'state not moved yet at stop');
    return 0;
  };
  const r = await moveOldLinkNames({ root: s.root, act: s.act, systemctl });
  t.same(calls, ['is-active --quiet agent-connectors-renew-fetch.service', 'stop agent-connectors-renew-fetch.service']);
  t.same(r, { startLink: true });
  t.same(s.done.map((d) => d[0]), ['stop the old link unit', 'move state']);
});

t.test('a failed stop moves nothing', async (t) => {
  const s = scratch(t);
  plant(s.at('/var/lib/private/agent-connectors-renew-fetch/a'), 'old\n');
  const systemctl: Systemctl = async (args) => (args[0] === 'stop' ? 1 : 0);
  await t.rejects(moveOldLinkNames({ root: s.root, act: s.act, systemctl }), /systemctl stop agent-connectors-renew-fetch\.service failed \(exit 1\); nothing was moved/);
  t.equal(readFileSync(s.at('/var/lib/private/agent-connectors-renew-fetch/a'), 'utf8'), 'old\n');
});

t.test('an inactive old unit: nothing to start', async (t) => {
  const s = scratch(t);
  const r = await moveOldLinkNames({ root: s.root, act: s.act, systemctl: async () => 3 });
  t.same(r, { startLink: false });
  t.same(s.done, [], 'and nothing done on a host without 0.1.0');
});
