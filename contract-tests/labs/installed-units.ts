import { randomBytes } from 'node:crypto';
import { chmodSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import t from 'tap';
import { request } from 'undici';
import { CLI_PROXY_PORT, FORWARDER_PORT, groupId, Lab, LAB_QUEUE_ALLOWANCE_MS, labSkipReason } from '../../test/support/lab.js';
import { APPLY, AGENT_USER, CLI_PROXY, DYNAMIC_UIDS, LINK, FORWARDER, installForLab, LIB_DIR, STATE, SVC, TARGET } from '../helpers/lab-package.js';
import { checkWith, labSteps, recordMinted, unbridged } from '../helpers/lab-run.js';
import { scrape } from '../helpers/scrape.js';
import { McpUpstream } from '../helpers/mcp-upstream.js';
import { MockRenewGateway } from '../../test/support/mock-renew-gateway.js';
import { unlessMissing } from '../../test/tools/prerequisite.js';

/**
 * The units booted for real (SPEC §7, issue 5): `install` into a scratch root, the
 * installed units started under a throw-away systemd (test/tools/systemd-lab.sh, one boot), and
 * driven step by step from here through `nsenter`. The lab shares the host's loopback, so
 * the mock renewal Gateway, the MCP upstream and the MCP client all run in this process.
 *
 * Fixed ports: the units listen on 127.0.0.1:14323 and :14324. No other test binds them
 * (they all use port 0); if something does, this file fails up front and says so.
 */

const INSTANCE = 'lab-inst';
const SLOT = `instance:${INSTANCE}`;
const BINDING = `lab_${randomBytes(12).toString('base64url')}`;
const TOKEN_FILE = `${STATE}/mcp-forwarder/${INSTANCE}.token`;
const LINK_CREDENTIAL = `/run/credentials/${LINK}/host-credential`;
const LINK_STATE = '/var/lib/private/agent-connectors-link';
/** Token lifetime at the mock Gateway: fetch renews with a third left, so a rotation comes ~10 s after the first token. */
const TOKEN_LIFETIME_MS = 15_000;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A pino JSON line of a unit's journal, or undefined for anything else. */
interface LogLine {
  msg?: string;
  level?: number | string;
  [k: string]: unknown;
}
function parseLog(line: string): LogLine | undefined {
  if (!line.startsWith('{')) return undefined;
  try {
    return JSON.parse(line) as LogLine;
  } catch {
    return undefined;
  }
}

/** `journalctl -o json` entries: message and the UID of the process that logged it. */
async function journalEntries(lab: Lab, unit: string): Promise<Array<{ msg: LogLine | undefined; uid: number }>> {
  const out = await lab.sh(`journalctl --no-pager -u ${unit} -o json --output-fields=MESSAGE,_UID`);
  return out
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { MESSAGE?: unknown; _UID?: string })
    .filter((e) => typeof e.MESSAGE === 'string' && e._UID !== undefined)
    .map((e) => ({ msg: parseLog(e.MESSAGE as string), uid: Number(e._UID) }));
}

/** Applied token ids, in order, from apply's journal. */
async function appliedTokenIds(lab: Lab): Promise<string[]> {
  return (await lab.journal(APPLY))
    .split('\n')
    .map(parseLog)
    .filter((l): l is LogLine => l?.msg === 'token applied' && typeof l.tokenId === 'string')
    .map((l) => l.tokenId as string);
}

async function waitForApplied(lab: Lab, pred: (ids: string[]) => boolean, timeoutMs: number): Promise<string[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ids = await appliedTokenIds(lab);
    if (pred(ids)) return ids;
    if (Date.now() > deadline) throw new Error(`timed out waiting for apply; applied so far: ${JSON.stringify(ids)}`);
    await sleep(200);
  }
}

/** The lines of systemd's console about one unit (for diagnostics). */
function unitLines(text: string, unit: string): string {
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${unit}: `) && !/PropertiesChanged|mount|Mount|system call/.test(l))
    .slice(-60)
    .join('\n');
}

/** The drop-in a unit file's comment documents for metrics ("#   " lines after "Metrics are off"). */
function metricsDropIn(unitText: string): string {
  const from = unitText.indexOf('# Metrics are off.');
  if (from < 0) return '';
  const lines: string[] = [];
  for (const line of unitText.slice(from).split('\n').slice(1)) {
    if (!line.startsWith('#   ')) break;
    lines.push(line.slice(4));
  }
  return `${lines.join('\n')}\n`;
}

/** Runs a command inside the lab as a user with no supplementary groups (what an agent is). */
function asUser(user: { uid: number; gid: number }, command: string): string {
  return `setpriv --reuid=${user.uid} --regid=${user.gid} --clear-groups -- ${command}`;
}

const skipReason = labSkipReason();
// Queuing for the one-lab-at-a-time lock counts against the file's timeout.
t.setTimeout(240_000 + LAB_QUEUE_ALLOWANCE_MS);

t.test('systemd lab: installed units under a real systemd', { skip: unlessMissing(t, skipReason), timeout: 210_000 + LAB_QUEUE_ALLOWANCE_MS }, async (t) => {
  // ---- host side: install, users, Gateway, upstream (Lab.boot checks the fixed ports) ----
  const pkg = await installForLab(t, 'ac-lab-');
  if (!pkg) return;
  const { work, unitDir, appDir, tmpfilesConf, svc, agent, dropIn } = pkg;
  const renewGid = await groupId('agent-connectors-renew');
  if (renewGid === undefined) {
    t.fail('the group agent-connectors-renew is missing after systemd-sysusers');
    return;
  }

  const credential = `hostcred-${randomBytes(24).toString('base64url')}`;
  const gw = await MockRenewGateway.start({ credential, tokenLifetimeMs: TOKEN_LIFETIME_MS, slots: [SLOT] });
  t.teardown(() => gw.close());
  const minted = recordMinted(gw.authority);
  const upstream = await McpUpstream.start({ tools: ['echo'], check: checkWith(gw.authority, minted) });
  t.teardown(() => upstream.close());

  // ---- the units as installed, plus the lab's drop-ins ------------------------------------
  // The operator would put the credential in /etc/agent-connectors; the lab's /etc is the
  // host's (read-only), so the credential lives beside the units and a drop-in points at it.
  const credentialFile = join(unitDir, 'host-credential');
  writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
  chmodSync(credentialFile, 0o600);
  dropIn(LINK, 'lab.conf', `[Service]\nLoadCredential=\nLoadCredential=host-credential:${credentialFile}\nEnvironment=AGENT_CONNECTORS_GATEWAY_URL=${gw.url}\n`);

  // ---- boot ------------------------------------------------------------------------------
  let lab: Lab;
  try {
    lab = pkg.lab = await Lab.boot({ unitDir, appDir, appMount: LIB_DIR, work, limitS: 210 });
  } catch (err) {
    t.fail((err as Error).message);
    return;
  }
  t.comment(`lab systemd is host pid ${lab.hostPid}; scratch ${pkg.scratch}`);

  const step = labSteps(t);

  await step('tmpfiles.d creates the state directories with the modes of SPEC §2', async (tt) => {
    await lab.sh(`systemd-tmpfiles --create ${tmpfilesConf}`);
    const modes = await lab.sh(`stat -c '%n %a %U %G' ${STATE} ${STATE}/mcp-forwarder ${STATE}/cli-proxy ${STATE}/handoff ${STATE}/handoff/inbox ${STATE}/handoff/slots /var/lib/agent-connectors-shims`);
    tt.same(modes.trim().split('\n'), [
      `${STATE} 750 ${SVC} agent-connectors-renew`,
      `${STATE}/mcp-forwarder 700 ${SVC} ${SVC}`,
      `${STATE}/cli-proxy 700 ${SVC} ${SVC}`,
      `${STATE}/handoff 3770 ${SVC} agent-connectors-renew`,
      `${STATE}/handoff/inbox 2770 ${SVC} agent-connectors-renew`,
      `${STATE}/handoff/slots 2770 ${SVC} agent-connectors-renew`,
      `/var/lib/agent-connectors-shims 755 ${SVC} ${SVC}`,
    ], 'state root 0750, part dirs 0700, hand-off dirs 2770 with the renew group (the root sticky: 3770), the shim directory 0755 outside the state root');
    // A provider catalog and its token for cli-proxy, written by root as an operator would.
    const catalog = JSON.stringify({
      labcli: {
        upstream: 'http://127.0.0.1:9/api',
        tokenFile: `${STATE}/cli-proxy/labcli.token`,
        inject: { type: 'header', name: 'authorization', value: 'Bearer {token}' },
      },
    });
    await lab.sh(
      `umask 077 && printf '%s\\n' '${catalog}' > ${STATE}/cli-proxy/providers.json && printf 'labcli-${randomBytes(9).toString('hex')}\\n' > ${STATE}/cli-proxy/labcli.token && chown ${SVC}:${SVC} ${STATE}/cli-proxy/providers.json ${STATE}/cli-proxy/labcli.token`,
    );
  });

  await step('starting agent-connectors.target: the forwarder is active (running) via READY=1 with a STATUS', async (tt) => {
    await lab.sh(`systemctl log-level debug && systemctl start ${TARGET}`);
    const fwd = await lab.waitShow(FORWARDER, ['ActiveState', 'SubState', 'Type', 'NotifyAccess', 'StatusText', 'MainPID'], (p) => p.ActiveState === 'active' || p.ActiveState === 'failed');
    tt.same([fwd.ActiveState, fwd.SubState], ['active', 'running'], 'forwarder: active (running)');
    tt.equal(fwd.Type, 'notify', 'Type=notify: active only after READY=1');
    tt.equal(fwd.StatusText, 'serving 0 instance(s)', 'STATUS= text from the forwarder');
    const u = FORWARDER.replace(/\./g, '\\.');
    const ready = await lab.waitConsole(
      0,
      new RegExp(`${u}: Got notification message from PID \\d+ \\(.*READY=1.*STATUS=serving 0 instance\\(s\\).*\\n(?:.*\\n)*?${u}: Changed start -> running`),
    );
    tt.ok(ready.ok, 'systemd: READY=1 with the STATUS took the unit from start to running', { log: unitLines(ready.text, FORWARDER) });
    for (const unit of [CLI_PROXY, LINK, APPLY]) {
      const p = await lab.waitShow(unit, ['ActiveState', 'SubState', 'StatusText'], (s) => s.ActiveState === 'active' || s.ActiveState === 'failed');
      tt.same([p.ActiveState, p.SubState], ['active', 'running'], `${unit}: active (running)${p.StatusText ? `, STATUS=${p.StatusText}` : ''}`);
    }
    const health = await fetch(`http://127.0.0.1:${FORWARDER_PORT}/healthz`);
    tt.equal(health.status, 200, 'forwarder /healthz answers on the fixed port');
    tt.match(await health.json(), { status: 'ok', instances: 0 }, '/healthz: ok, no instances yet');
    const catalog = await lab.waitJournal(CLI_PROXY, (l) => parseLog(l)?.msg === 'catalog loaded');
    tt.equal(parseLog(catalog)?.providers, 1, 'cli-proxy loaded the provider catalog');
  });

  await step("each service runs under its unit's MemoryMax=, LimitNOFILE= and TasksMax= (docs/units.md, Resource limits)", async (tt) => {
    const want: Record<string, { memory: string; nofile: string; tasks: string }> = {
      [FORWARDER]: { memory: '1073741824', nofile: '16384', tasks: '64' },
      [CLI_PROXY]: { memory: '1073741824', nofile: '16384', tasks: '64' },
      [LINK]: { memory: '1073741824', nofile: '1024', tasks: '64' },
      [APPLY]: { memory: '1073741824', nofile: '1024', tasks: '64' },
    };
    for (const [unit, w] of Object.entries(want)) {
      const p = await lab.show(unit, ['MemoryMax', 'LimitNOFILE', 'TasksMax', 'MainPID']);
      tt.same([p.MemoryMax, p.LimitNOFILE, p.TasksMax], [w.memory, w.nofile, w.tasks], `${unit}: MemoryMax=1G, LimitNOFILE=${w.nofile}, TasksMax=${w.tasks}`);
      const limits = await lab.sh(`grep '^Max open files' /proc/${p.MainPID}/limits`);
      tt.match(limits, new RegExp(`^Max open files\\s+${w.nofile}\\s+${w.nofile}\\s`), `${unit}: its process runs with ${w.nofile} descriptors, soft and hard`);
    }
  });

  let fetchUid = -1;
  await step('renew fetch runs as a dynamic UID with its credential', async (tt) => {
    const p = await lab.show(LINK, ['MainPID', 'DynamicUser']);
    tt.equal(p.DynamicUser, 'yes', 'DynamicUser=yes');
    const status = await lab.sh(`cat /proc/${p.MainPID}/status`);
    const uids = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(status)?.slice(1).map(Number) ?? [];
    const groups = (/^Groups:\s*(.*)$/m.exec(status)?.[1] ?? '').trim().split(/\s+/).filter(Boolean).map(Number);
    fetchUid = uids[0] ?? -1;
    tt.equal(new Set(uids).size, 1, `real, effective, saved and fs uid agree (${uids.join(' ')})`);
    tt.not(fetchUid, 0, 'not root');
    tt.not(fetchUid, svc.uid, 'not the agent-connectors service user');
    tt.ok(fetchUid >= DYNAMIC_UIDS[0] && fetchUid <= DYNAMIC_UIDS[1], `a dynamic UID (${fetchUid}, systemd's range ${DYNAMIC_UIDS.join('–')})`);
    tt.ok(groups.includes(renewGid), `in the hand-off group agent-connectors-renew (${renewGid}); groups: ${groups.join(' ')}`);
    tt.equal((await lab.sh(`stat -c '%u %a' ${LINK_CREDENTIAL}`)).trim(), `${fetchUid} 400`, 'its credential is in $CREDENTIALS_DIRECTORY, 0400, owned by the dynamic UID');
    tt.equal((await lab.sh(`cat ${LINK_CREDENTIAL}`)).trim(), credential, 'LoadCredential= loaded the file the drop-in names');
  });

  await step('bind, then systemctl reload: reloading → active, and the new binding is served', async (tt) => {
    const before = await lab.show(FORWARDER, ['MainPID']);
    const consoleFrom = lab.consoleLog().length;
    const bound = await lab.sh(`${process.execPath} ${LIB_DIR}/dist/cli.js bind ${BINDING} --instance-id ${INSTANCE} --upstream ${upstream.url()} --state-dir ${STATE}`);
    tt.equal(bound.trim(), BINDING, 'bind prints the binding id');
    tt.equal((await lab.sh(`stat -c '%a %U' ${STATE}/mcp-forwarder/instances.json`)).trim(), `600 ${SVC}`, 'instances.json: 0600, still owned by the service user although root wrote it');
    tt.match(await lab.sh(`cat '${STATE}/handoff/slots/${SLOT}.json'`), /"slot":"instance:lab-inst"/, 'bind created the slot file for fetch');

    await lab.sh(`systemctl reload ${FORWARDER}`);
    const after = await lab.waitShow(FORWARDER, ['ActiveState', 'SubState', 'StatusText', 'MainPID'], (p) => p.ActiveState === 'active' && p.StatusText === 'serving 1 instance(s)', 10_000);
    tt.same([after.ActiveState, after.SubState], ['active', 'running'], 'back to active (running)');
    tt.equal(after.MainPID, before.MainPID, 'same process: reloaded, not restarted');
    // The reload as systemd saw it (debug log). The unit enters "reload" for ExecReload (kill -HUP)
    // or on RELOADING=1, whichever comes first, and leaves it only on READY=1 after RELOADING=1.
    const u = FORWARDER.replace(/\./g, '\\.');
    const reload = await lab.waitConsole(
      consoleFrom,
      new RegExp(
        `${u}: Got notification message from PID \\d+ \\(.*RELOADING=1.*\\n(?:.*\\n)*?` +
          `${u}: Got notification message from PID \\d+ \\(.*READY=1.*\\n(?:.*\\n)*?${u}: Changed reload -> running`,
      ),
    );
    const excerpt = unitLines(reload.text, FORWARDER);
    tt.ok(reload.text.includes(`${FORWARDER}: Changed running -> reload`), 'systemd: the unit went from running to reloading', { log: excerpt });
    tt.ok(reload.ok, 'systemd: RELOADING=1, then READY=1, then "reload -> running"', { log: excerpt });
    tt.ok((await lab.journal(FORWARDER)).includes('SIGHUP: reloading registry'), 'the forwarder logged the SIGHUP reload');
    await lab.sh('systemctl log-level info');

    const unknown = await fetch(`http://127.0.0.1:${FORWARDER_PORT}/i/lab_not_a_binding_0/mcp`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
    tt.equal(unknown.status, 404, 'an unknown binding is 404');
    const known = await fetch(`http://127.0.0.1:${FORWARDER_PORT}/i/${BINDING}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
    });
    const body = await known.text();
    tt.not(known.status, 404, `the new binding is known to the forwarder (${known.status} ${body.slice(0, 80)})`);
  });

  let firstTokenId = '';
  await step('fetch renews, the apply watcher writes the token file', async (tt) => {
    const ids = await waitForApplied(lab, (i) => i.length >= 1, 20_000);
    firstTokenId = ids[0] ?? '';
    tt.equal(firstTokenId, gw.authority.slotState(SLOT)?.tokenId ?? 'none', "apply's journal: 'token applied' with the Gateway's token id");
    const requests = gw.requestsFor(SLOT);
    tt.ok(requests.length >= 1 && requests.every((r) => r.authorization), 'fetch called the Gateway with its credential');
    tt.equal(requests[0]?.outcome, 200, 'and was answered 200');
    tt.equal(gw.authority.stats().unauthorized, 0, 'never with a wrong credential');
    const fetchLogs = await journalEntries(lab, LINK);
    const renewed = fetchLogs.find((e) => e.msg?.msg === 'renewed; handed to apply');
    tt.ok(renewed, "fetch's journal: 'renewed; handed to apply'");
    tt.equal(renewed?.uid, fetchUid, 'logged by the dynamic UID');
    const applyLogs = await journalEntries(lab, APPLY);
    const applied = applyLogs.find((e) => e.msg?.msg === 'token applied');
    tt.equal(applied?.uid, svc.uid, 'apply ran as agent-connectors');
    const state = await lab.show(APPLY, ['ActiveState', 'SubState', 'NRestarts']);
    tt.same([state.ActiveState, state.SubState, state.NRestarts], ['active', 'running', '0'], 'apply keeps running, never restarted');
    tt.equal((await lab.sh(`stat -c '%a %U' ${TOKEN_FILE}`)).trim(), `600 ${SVC}`, 'token file: 0600 agent-connectors');
    tt.equal((await lab.sh(`ls -A ${STATE}/handoff/inbox`)).trim(), '', 'the inbox is empty again');
  });

  await step("as the link's UID: its own files in the sticky hand-off root replaced, apply's directories not renamed away", async (tt) => {
    const asLink = (script: string): string => `setpriv --reuid=${fetchUid} --regid=${renewGid} --clear-groups -- sh -c '${script}'`;
    const own = await lab.exec(asLink(`cd ${STATE}/handoff && echo 1 > .probe.tmp && mv .probe.tmp probe && echo 2 > .probe.tmp && mv .probe.tmp probe && rm probe`));
    tt.equal(own.code, 0, `the link writes and replaces its own file in the root (${own.stderr.trim()})`);
    for (const dir of ['inbox', 'slots']) {
      const swap = await lab.exec(asLink(`mv ${STATE}/handoff/${dir} ${STATE}/handoff/${dir}.moved`));
      tt.not(swap.code, 0, `${dir}/ cannot be renamed away by the link`);
      tt.match(swap.stderr, /Operation not permitted/, 'EPERM: the sticky bit');
    }
    tt.equal((await lab.sh(`stat -c '%F' ${STATE}/handoff/inbox ${STATE}/handoff/slots`)).trim(), 'directory\ndirectory', 'both still in place');
  });

  await step('watchdog: a stalled event loop ends in Result=watchdog and a restart', async (tt) => {
    // The test-only hook: SIGUSR2 blocks the event loop for good. TimeoutAbortSec bounds the
    // SIGABRT → SIGKILL escalation (see the comment in the drop-in).
    dropIn(
      FORWARDER,
      'test.conf',
      '[Service]\nEnvironment=AGENT_CONNECTORS_TEST_HOOKS=stall-on-sigusr2\nWatchdogSec=2s\n' +
        '# A JS signal handler (execa\'s signal-exit, while an sd_notify helper runs) can catch the\n' +
        '# watchdog\'s SIGABRT in a process whose event loop is stuck; escalate to SIGKILL soon.\n' +
        'TimeoutAbortSec=3s\n',
    );
    await lab.sh(`systemctl daemon-reload && systemctl restart ${FORWARDER}`);
    const started = await lab.waitShow(FORWARDER, ['ActiveState', 'SubState', 'NRestarts', 'MainPID', 'WatchdogUSec'], (p) => p.ActiveState === 'active');
    tt.equal(started.WatchdogUSec, '2s', 'WatchdogSec=2s from the drop-in');
    await sleep(1500); // the forwarder keeps pinging (WATCHDOG=1 every 1 s) while healthy
    tt.equal((await lab.show(FORWARDER, ['MainPID'])).MainPID, started.MainPID, 'a healthy forwarder outlives its watchdog period');
    const consoleFrom = lab.consoleLog().length;
    const u = FORWARDER.replace(/\./g, '\\.');
    await lab.sh(`systemctl kill --kill-who=main -s SIGUSR2 ${FORWARDER}`);
    const results = new Set<string>();
    const after = await lab.waitShow(
      FORWARDER,
      ['ActiveState', 'SubState', 'Result', 'NRestarts', 'MainPID'],
      (p) => {
        results.add(p.Result ?? '');
        return Number(p.NRestarts) > Number(started.NRestarts) && p.ActiveState === 'active';
      },
      40_000,
    );
    const wd = await lab.waitConsole(consoleFrom, new RegExp(`${u}: Watchdog timeout \\(limit 2s\\)!\\n(?:.*\\n)*?${u}: Failed with result 'watchdog'`));
    tt.ok(wd.ok, "systemd: watchdog timeout, then Failed with result 'watchdog'", { log: unitLines(wd.text, FORWARDER) });
    tt.ok(results.has('watchdog'), `Result=watchdog observed (${[...results].join(', ')})`);
    tt.equal(Number(after.NRestarts), Number(started.NRestarts) + 1, `NRestarts ${started.NRestarts} → ${after.NRestarts}`);
    tt.same([after.ActiveState, after.SubState], ['active', 'running'], 'active (running) again');
    tt.not(after.MainPID, started.MainPID, 'a new process');
    const health = await fetch(`http://127.0.0.1:${FORWARDER_PORT}/healthz`);
    tt.match(await health.json(), { status: 'ok', instances: 1 }, 'the restarted forwarder serves, with its registry');
    // Back to the shipped unit for the rest of the run (a running service keeps the watchdog
    // timeout it started with, so restart it; no client is connected yet, nothing to drain).
    rmSync(join(unitDir, `${FORWARDER}.d`, 'test.conf'));
    await lab.sh(`systemctl daemon-reload && systemctl restart ${FORWARDER}`);
    const shipped = await lab.waitShow(FORWARDER, ['ActiveState', 'WatchdogUSec'], (p) => p.ActiveState === 'active');
    tt.equal(shipped.WatchdogUSec, '30s', 'test drop-in gone: WatchdogSec=30s again');
  });

  const client = new Client({ name: 'lab-agent', version: '0.0.0' });
  let clientClosed = false;
  const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${FORWARDER_PORT}/i/${BINDING}/mcp`));
  t.teardown(() => client.close().catch(() => undefined));
  let sessionId: string | undefined;
  const echo = async (text: string): Promise<string> => {
    const r = await client.callTool({ name: 'echo', arguments: { text } });
    const content = (r.content ?? []) as Array<{ type: string; text?: string }>;
    return content[0]?.text ?? '';
  };

  await step('an MCP SDK client on loopback works end to end through the started units', async (tt) => {
    await client.connect(transport);
    sessionId = transport.sessionId;
    tt.ok(sessionId, 'the upstream session id reached the client');
    const tools = await client.listTools();
    tt.same(tools.tools.map((x) => x.name), ['echo'], 'tools/list through the forwarder');
    tt.equal(await echo('hello from the lab'), 'echo: hello from the lab', 'tools/call through the forwarder');
    tt.same(unbridged(upstream.seen), [], 'every upstream request carried a token the Gateway minted, a superseded one retried with the renewed token');
    const applied = await appliedTokenIds(lab);
    const notApplied = [...new Set(upstream.seen.filter((s) => s.valid).map((s) => s.tokenId))].filter((id) => id === undefined || !applied.includes(id));
    tt.same(notApplied, [], `only tokens apply wrote reached the upstream (applied: ${applied.join(', ')})`);
  });

  await step(
    'privilege model: the agent UID reads no secret, but can use both loopback services; other UIDs are refused',
    async (tt) => {
      // fetch must be up for its credential to exist (see the crash check further down).
      await lab.waitShow(LINK, ['ActiveState', 'SubState'], (p) => p.ActiveState === 'active' && p.SubState === 'running', 15_000);
      const fetchStateFile = (await lab.sh(`find ${LINK_STATE} -type f | head -1`)).trim();
      tt.ok(fetchStateFile, `fetch keeps state in ${LINK_STATE}`);
      const denied: Array<[string, string]> = [
        ['token file', `cat ${TOKEN_FILE}`],
        ['instances.json', `cat ${STATE}/mcp-forwarder/instances.json`],
        ['providers.json', `cat ${STATE}/cli-proxy/providers.json`],
        ['a provider token file', `cat ${STATE}/cli-proxy/labcli.token`],
        ['the hand-off inbox', `ls ${STATE}/handoff/inbox`],
        ["the hand-off slots", `ls ${STATE}/handoff/slots`],
        ["fetch's credential", `cat ${LINK_CREDENTIAL}`],
        ["fetch's credential directory", `ls /run/credentials/${LINK}`],
        ["fetch's state directory", `ls ${LINK_STATE}`],
        ["a fetch state file", `cat '${fetchStateFile}'`],
      ];
      for (const [what, cmd] of denied) {
        const target = cmd.replace(/^(cat|ls) /, '');
        const exists = await lab.exec(`test -e ${target}`);
        tt.equal(exists.code, 0, `${what} exists (${target})`);
        const r = await lab.exec(asUser(agent, cmd));
        tt.ok(r.code !== 0 && /Permission denied/.test(r.stderr), `${AGENT_USER}: ${cmd} → EACCES (${r.code}: ${r.stderr.trim()})`);
        tt.equal(r.stdout, '', 'and prints nothing');
      }
      const agentSecrets = (await lab.exec(asUser(agent, `grep -rsl -e '${credential}' ${STATE} /run/credentials /var/lib/private`))).stdout;
      tt.equal(agentSecrets, '', 'grep as the agent finds no credential anywhere it can read');

      for (const port of [FORWARDER_PORT, CLI_PROXY_PORT]) {
        const r = await lab.exec(asUser(agent, `curl -sS -m 5 http://127.0.0.1:${port}/healthz`));
        tt.equal(r.code, 0, `${AGENT_USER}: curl 127.0.0.1:${port}/healthz works (${r.stderr.trim()})`);
        tt.match(r.stdout, /"status":"ok"/, 'and says ok');
      }
      const init = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'curl', version: '0' } } });
      const mcp = await lab.exec(
        asUser(agent, `curl -sS -m 10 -o /dev/null -w '%{http_code}' -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' --data '${init}' http://127.0.0.1:${FORWARDER_PORT}/i/${BINDING}/mcp`),
      );
      tt.equal(mcp.stdout, '200', `${AGENT_USER}: an MCP initialize through the forwarder is answered 200`);

      const nobody = { uid: 65534, gid: 65534 };
      for (const port of [FORWARDER_PORT, CLI_PROXY_PORT]) {
        const r = await lab.exec(asUser(nobody, `curl -sS -m 5 -w '\\n%{http_code}' http://127.0.0.1:${port}/healthz`));
        const [body, code] = r.stdout.trim().split('\n');
        tt.equal(code, '403', `uid 65534 (not in --allowed-uids): 127.0.0.1:${port} answers 403`);
        tt.match(body ?? '', /forbidden_peer/, 'forbidden_peer');
      }
    },
    false,
  );

  await step('a renewal rotates the token; the same MCP session goes on with the new one', async (tt) => {
    const ids = await waitForApplied(lab, (i) => i.some((id) => id !== firstTokenId), TOKEN_LIFETIME_MS + 10_000);
    const second = ids.find((id) => id !== firstTokenId) ?? '';
    tt.ok(second, `apply applied a second token (${ids.length} applied in all)`);
    const from = upstream.seen.length;
    tt.equal(await echo('after renewal'), 'echo: after renewal', 'tools/call in the same session');
    const now = upstream.seen.slice(from);
    tt.ok(now.length > 0 && now.every((s) => s.sessionId === sessionId), 'same session id');
    // A later renewal can race this call too: then its first request is refused and retried.
    tt.same(unbridged(now), [], 'a valid token, or a superseded one retried with the renewed token');
    tt.ok(now.every((s) => !s.valid || s.tokenId !== firstTokenId), 'no longer the first token');
    const applied = await appliedTokenIds(lab);
    tt.ok(applied.indexOf(now.at(-1)?.tokenId ?? '') > 0, `a token applied after the first one (${now.at(-1)?.tokenId} of ${applied.join(', ')})`);
  });

  await step(
    'no token and no credential in any log',
    async (tt) => {
      const all = (await lab.exec('journalctl --no-pager -o cat')).stdout + lab.consoleLog();
      tt.ok(minted.length >= 2, `${minted.length} tokens were minted`);
      tt.same(
        [credential, ...minted].filter((s) => all.includes(s)).map((s) => `${s.slice(0, 6)}…`),
        [],
        'none appears in the journal or the systemd console',
      );
    },
    false,
  );

  await step(
    'no unit crashed during the run',
    async (tt) => {
      // NRestarts counts automatic restarts since the last manual start (the forwarder's
      // watchdog restart was followed by a manual one).
      for (const unit of [FORWARDER, CLI_PROXY, LINK]) {
        const restarts = 0;
        const p = await lab.show(unit, ['NRestarts']);
        // A crash prints a stack trace (not pino JSON) to the journal: show it.
        const crash = (await lab.journal(unit))
          .split('\n')
          .filter((l) => l.trim() !== '' && parseLog(l) === undefined)
          .slice(-16)
          .join('\n');
        tt.equal(Number(p.NRestarts), restarts, `${unit}: NRestarts=${restarts}`, crash ? { stderr: crash } : {});
      }
    },
    false,
  );

  await step(
    'renew fetch survives a file in slots/ it cannot read (as apply\'s temp files are, for a moment)',
    async (tt) => {
      // apply (UMask=0077) writes slots/<slot>.json atomically: the temp file is created 0600
      // and only then chmod'ed to 0640, so for a moment fetch's dynamic UID cannot read it.
      // Same here, without touching a real slot: an unreadable temp file appears and goes.
      const before = await lab.show(LINK, ['MainPID', 'NRestarts']);
      await lab.sh(
        asUser(
          { uid: svc.uid, gid: renewGid },
          `bash -c 'umask 077; cd ${STATE}/handoff/slots && for i in $(seq 1 20); do t=.lab-probe.json.$i.tmp; printf "{}\\n" > $t; sleep 0.05; rm -f $t; done'`,
        ),
      );
      await sleep(500);
      const after = await lab.show(LINK, ['MainPID', 'NRestarts', 'ActiveState', 'SubState']);
      const crash = (await lab.journal(LINK))
        .split('\n')
        .filter((l) => l.trim() !== '' && parseLog(l) === undefined)
        .slice(-16)
        .join('\n');
      tt.same(
        { pid: after.MainPID, restarts: after.NRestarts, state: `${after.ActiveState} (${after.SubState})` },
        { pid: before.MainPID, restarts: before.NRestarts, state: 'active (running)' },
        'the same fetch process is still running',
        crash ? { stderr: crash } : {},
      );
      // Let a crashed fetch come back before the clean-stop check.
      await lab.waitShow(LINK, ['ActiveState', 'SubState'], (p) => p.ActiveState === 'active' && p.SubState === 'running', 15_000).catch(() => undefined);
    },
    false,
  );

  await step('apply killed with SIGKILL is restarted by systemd, applies the next renewal, leaves no partial file', async (tt) => {
    const before = await lab.show(APPLY, ['MainPID', 'NRestarts']);
    const appliedBefore = (await appliedTokenIds(lab)).length;
    await lab.sh(`systemctl kill --kill-who=main -s SIGKILL ${APPLY}`);
    const after = await lab.waitShow(
      APPLY,
      ['ActiveState', 'SubState', 'NRestarts', 'MainPID'],
      (p) => Number(p.NRestarts) > Number(before.NRestarts) && p.ActiveState === 'active',
      30_000,
    );
    tt.same([after.ActiveState, after.SubState], ['active', 'running'], 'Restart=on-failure brought it back');
    tt.not(after.MainPID, before.MainPID, 'a new apply process');
    const ids = await waitForApplied(lab, (i) => i.length > appliedBefore, TOKEN_LIFETIME_MS + 10_000);
    tt.ok(ids.length > appliedBefore, `the restarted apply applied the next renewal (${ids.length} applied in all)`);
    tt.equal((await lab.sh(`ls -A ${STATE}/handoff/inbox`)).trim(), '', 'no hand-off left behind');
    tt.equal((await lab.sh(`ls -A ${STATE}/mcp-forwarder | grep '^[.]' || true`)).trim(), '', 'no temp or partial file beside the token');
    tt.equal((await lab.sh(`stat -c '%a %U' ${TOKEN_FILE}`)).trim(), `600 ${SVC}`, 'the token file is whole: 0600 agent-connectors');
    tt.equal(await echo('after apply restart'), 'echo: after apply restart', 'the MCP session goes on');
  });

  await step('metrics on through the drop-in each unit documents: served on loopback under its hardening', async (tt) => {
    // The SDK client holds a standing SSE GET; closing it lets the forwarder restart at once.
    await client.close();
    clientClosed = true;
    const ports: Record<string, number> = {};
    for (const unit of [FORWARDER, LINK, APPLY]) {
      const text = metricsDropIn(readFileSync(join(unitDir, unit), 'utf8'));
      const port = /AGENT_CONNECTORS_METRICS_LISTEN=127\.0\.0\.1:(\d+)/.exec(text)?.[1];
      tt.ok(port, `${unit} documents a metrics drop-in with a loopback port`, { text });
      ports[unit] = Number(port);
      dropIn(unit, 'metrics.conf', text);
    }
    const appliedBefore = (await appliedTokenIds(lab)).length;
    await lab.sh(`systemctl daemon-reload && systemctl restart ${FORWARDER} ${LINK} ${APPLY}`);
    for (const unit of [FORWARDER, LINK, APPLY]) {
      const p = await lab.waitShow(unit, ['ActiveState', 'SubState'], (x) => x.ActiveState === 'active' && x.SubState === 'running', 20_000);
      tt.same([p.ActiveState, p.SubState], ['active', 'running'], `${unit} runs with metrics on`);
    }
    // A renewal after the restart: the link counts it, apply counts the token it applies.
    await waitForApplied(lab, (ids) => ids.length > appliedBefore, 30_000);
    const ping = await fetch(`http://127.0.0.1:${FORWARDER_PORT}/i/${BINDING}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
    });
    await ping.text();
    const fwd = await scrape(ports[FORWARDER] as number);
    tt.equal(
      fwd.value('http_server_request_duration_seconds_count', { http_route: 'mcp', http_request_method: 'POST', http_response_status_code: String(ping.status), error_type: '' }),
      1,
      'the forwarder counted the one MCP request since its restart',
    );
    tt.equal(fwd.value('agent_connectors_config_entries', { file: 'instances.json' }), 1, 'and serves one binding');
    tt.equal(fwd.find('agent_connectors_build_info', { part: 'forwarder' }).length, 1, "every series has part='forwarder'");
    const link = await scrape(ports[LINK] as number);
    tt.ok(link.value('agent_connectors_renewal_iterations_total', { result: 'renewed' }) >= 1, 'the link counted its renewals');
    tt.ok(link.value('agent_connectors_token_expiry_timestamp_seconds', { slot: SLOT }) * 1000 > Date.now(), "and the slot's token expiry, in the future");
    tt.equal(link.find('agent_connectors_build_info', { part: 'link' }).length, 1, "part='link'");
    const apply = await scrape(ports[APPLY] as number);
    tt.ok(apply.value('agent_connectors_apply_tokens_total', { result: 'applied' }) >= 1, 'apply counted the token it applied');
    tt.equal(apply.find('agent_connectors_build_info', { part: 'apply' }).length, 1, "part='apply'");
    const refused = await request(`http://127.0.0.1:${ports[FORWARDER]}/metrics`, { headers: { host: 'metrics.example' } });
    await refused.body.dump();
    tt.equal(refused.statusCode, 403, 'a non-loopback Host is refused');
    for (const { text } of [fwd, link, apply]) {
      tt.notOk(text.includes(credential), 'no host credential in a scrape');
      tt.notOk(minted.some((token) => text.includes(token)), 'no token in a scrape');
    }
  });

  await step('systemctl stop agent-connectors.target is clean', async (tt) => {
    // The SDK client holds a standing SSE GET; closing it lets the forwarder drain at once.
    if (!clientClosed) await client.close();
    await lab.sh(`systemctl stop ${TARGET}`);
    for (const unit of [FORWARDER, CLI_PROXY, LINK, APPLY]) {
      const p = await lab.waitShow(unit, ['ActiveState', 'SubState', 'Result', 'ExecMainCode', 'ExecMainStatus'], (s) => s.ActiveState === 'inactive' || s.ActiveState === 'failed');
      tt.same(
        { state: `${p.ActiveState} (${p.SubState})`, result: p.Result, exit: p.ExecMainStatus },
        { state: 'inactive (dead)', result: 'success', exit: '0' },
        `${unit}: stopped, Result=success, exit 0`,
      );
    }
    const target = await lab.show(TARGET, ['ActiveState']);
    tt.equal(target.ActiveState, 'inactive', `${TARGET}: inactive`);
    const stopped = (await lab.journal(FORWARDER))
      .split('\n')
      .map(parseLog)
      .filter((l) => l !== undefined && l.msg === 'forwarder stopped')
      .at(-1);
    tt.match(stopped, { msg: 'forwarder stopped', clean: true }, 'the forwarder drained and stopped cleanly');
    pkg.journalAtEnd = (await lab.exec('journalctl --no-pager -o short-monotonic -u "agent-connectors*"')).stdout;
    tt.equal(await lab.shutdown(), 0, 'the lab itself ends cleanly');
  });
});
