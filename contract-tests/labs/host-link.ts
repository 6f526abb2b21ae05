import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { FORWARDER_PORT, Lab, LAB_QUEUE_ALLOWANCE_MS, labSkipReason } from '../../test/support/lab.js';
import { MockHostGateway } from '../../test/support/mock-host-gateway.js';
import { unlessMissing } from '../../test/tools/prerequisite.js';
import { APPLY, CLI_PROXY, devModulesDir, DYNAMIC_UIDS, LINK, FORWARDER, installForLab, LIB_DIR, STATE, SVC, TARGET } from '../helpers/lab-package.js';
import { labSteps, recordMinted } from '../helpers/lab-run.js';
import { McpUpstream } from '../helpers/mcp-upstream.js';

/**
 * The host link under a real systemd (issue 11): the package installed into a scratch
 * root and booted in the lab (test/support/lab.ts), the mock host Gateway of SPEC §8 on the
 * host (the lab shares its loopback). Inside the lab, as root, the real `enroll` turns a
 * pairing code read from stdin into the host credential; the link unit loads it with
 * LoadCredential= as its DynamicUser; a binding connected at the Gateway is reconciled by
 * apply and served by the forwarder to an SDK MCP client running as the agent UID, with a
 * token the link renewed; the disconnect deletes the token file and the forwarder answers
 * 404; presence reaches the Gateway and carries no secret.
 *
 * The lab's /etc is the host's, read-only, so enroll is pointed (--credential) at a
 * directory of the lab's scratch space instead of /etc/agent-connectors, and a drop-in
 * points the link unit's LoadCredential= and EnvironmentFile= there: the same two files
 * enroll writes, read the same way.
 */

const UNITS = [FORWARDER, CLI_PROXY, LINK, APPLY];
const INSTANCE = 'lab-link-inst';
const SLOT = `instance:${INSTANCE}`;
const BINDING = `lab_link_${randomBytes(12).toString('base64url')}`;
const TOKEN_FILE = `${STATE}/mcp-forwarder/${INSTANCE}.token`;
const DESIRED = `${STATE}/handoff/desired-state.json`;
const APPLIED = `${STATE}/handoff/applied-state.json`;
/** The lab's own hard limit (seconds) and this file's budget before queuing for the lab. */
const LAB_LIMIT_S = 200;
const BUDGET_MS = 260_000;

/** A tiny MCP client as an agent would run one: the SDK from the checkout's node_modules, put beside it (devModulesDir). */
const CLIENT_SCRIPT = `import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
const [url, text] = process.argv.slice(2);
const client = new Client({ name: 'lab-link-agent', version: '0.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const tools = await client.listTools();
const called = await client.callTool({ name: 'echo', arguments: { text } });
await client.close();
process.stdout.write(JSON.stringify({ uid: process.getuid(), tools: tools.tools.map((x) => x.name), echo: called.content?.[0]?.text }) + '\\n');
`;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `probe` until it returns something, and returns it; throws naming what it waited
 * for. Not poll.ts's `until`: a probe here is often a process started through nsenter, too
 * heavy to run every 20 ms on a busy machine.
 */
async function eventually<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await probe();
    if (got !== undefined) return got;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(200);
  }
}

async function forwarderStatus(binding: string): Promise<number> {
  const r = await fetch(`http://127.0.0.1:${FORWARDER_PORT}/i/${binding}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
  });
  await r.arrayBuffer();
  return r.status;
}

const skipReason = labSkipReason();
// Queuing for the one-lab-at-a-time lock counts against the file's timeout.
t.setTimeout(BUDGET_MS + 60_000 + LAB_QUEUE_ALLOWANCE_MS);

t.test('systemd lab: enrol against the mock Gateway, a binding served and deleted, as the real users', { skip: unlessMissing(t, skipReason), timeout: BUDGET_MS + LAB_QUEUE_ALLOWANCE_MS }, async (t) => {
  const pkg = await installForLab(t, 'ac-lablink-');
  if (!pkg) return;
  const { work, unitDir, appDir, tmpfilesConf, agent, dropIn } = pkg;
  // Where enroll stores the credential and link.env (the lab keeps `work` at its path).
  const etcDir = join(work, 'etc-agent-connectors');
  const credentialFile = join(etcDir, 'host-credential');

  // Long-lived tokens: one renewal per slot in this run, so the token the client met is the one the link renewed.
  const gw = await MockHostGateway.start({ tokenLifetimeMs: 600_000 });
  t.teardown(() => gw.close());
  const minted = recordMinted(gw.authority);
  const upstream = await McpUpstream.start({
    tools: ['echo'],
    check: (token) => {
      const valid = token === undefined ? undefined : gw.authority.isValidToken(token);
      return valid ? { ok: true, tokenId: valid.tokenId } : { ok: false, problem: 'not a live token of the Gateway' };
    },
  });
  t.teardown(() => upstream.close());

  // ---- the installed units, plus the lab's drop-ins -----------------------------------------
  dropIn(LINK, 'lab.conf', `[Service]\nLoadCredential=\nLoadCredential=host-credential:${credentialFile}\nEnvironmentFile=-${join(etcDir, 'link.env')}\n`);
  const devDir = await devModulesDir(t, pkg);
  if (!devDir) return;
  writeFileSync(join(appDir, devDir, 'lab-mcp-client.mjs'), CLIENT_SCRIPT, { mode: 0o644 });

  let l: Lab;
  try {
    l = pkg.lab = await Lab.boot({ unitDir, appDir, appMount: LIB_DIR, work, limitS: LAB_LIMIT_S });
  } catch (err) {
    t.fail((err as Error).message);
    return;
  }
  const cli = `${process.execPath} ${LIB_DIR}/dist/cli.js`;

  const step = labSteps(t);

  const code = gw.control.issuePairingCode();
  let credential = '';
  await step('enroll inside the lab: the pairing code from stdin becomes the credential enroll stores', async (tt) => {
    await l.sh(`systemd-tmpfiles --create ${tmpfilesConf}`);
    // The code goes through a root-only file into stdin: never an argument of any process.
    const codeFile = join(work, 'pairing-code');
    writeFileSync(codeFile, `${code}\n`, { mode: 0o600 });
    const r = await l.exec(`${cli} enroll --gateway ${gw.url} --credential ${credentialFile} < ${codeFile}; rc=$?; rm -f ${codeFile}; exit $rc`, 60_000);
    tt.equal(r.code, 0, `enroll exits 0 (${r.stdout.trim()} ${r.stderr.trim()})`);
    tt.match(r.stdout, /enrolled as host \S+/, 'enroll says which host it became');
    tt.match(r.stdout, new RegExp(`${LINK} is not running; start it`), 'the link is not running yet: enroll says how to start it');
    const hosts = gw.control.hosts();
    tt.equal(hosts.length, 1, 'the Gateway has one enrolled host');
    tt.ok(hosts[0]?.hostname, `with the host's name (${hosts[0]?.hostname})`);
    tt.ok(gw.requestsTo('enroll').every((q) => !q.authorization && q.requestId), 'the enrolment carried a requestId and no Authorization');
    tt.equal((await l.sh(`stat -c '%a %U' ${credentialFile}`)).trim(), '600 root', 'the credential: 0600 root');
    credential = readFileSync(credentialFile, 'utf8').trim();
    tt.ok(gw.control.hostOf(credential), 'the stored credential is the one the Gateway issued');
    const env = readFileSync(join(etcDir, 'link.env'), 'utf8');
    tt.match(env, new RegExp(`^AGENT_CONNECTORS_GATEWAY_URL=${gw.url}$`, 'm'), 'link.env: the Gateway URL');
    tt.match(env, new RegExp(`^AGENT_CONNECTORS_HOST_ID=${hosts[0]?.hostId}$`, 'm'), 'link.env: the host id');
    tt.notOk(env.includes(credential), 'link.env holds no credential');
  });

  await step('starting the target: the link runs as its DynamicUser with the credential, polls and reports presence', async (tt) => {
    await l.sh(`systemctl start ${TARGET}`);
    for (const unit of UNITS) {
      const p = await l.waitShow(unit, ['ActiveState', 'SubState'], (s) => s.ActiveState === 'active' || s.ActiveState === 'failed');
      tt.same([p.ActiveState, p.SubState], ['active', 'running'], `${unit}: active (running)`);
    }
    const p = await l.show(LINK, ['MainPID']);
    const uid = Number(/^Uid:\s+(\d+)/m.exec(await l.sh(`cat /proc/${p.MainPID}/status`))?.[1]);
    tt.ok(uid >= DYNAMIC_UIDS[0] && uid <= DYNAMIC_UIDS[1], `the link runs as a dynamic UID (${uid})`);
    tt.equal((await l.sh(`stat -c '%u %a' /run/credentials/${LINK}/host-credential`)).trim(), `${uid} 400`, 'LoadCredential=: 0400, owned by that UID');
    await eventually('the link to hand over the first state', async () => ((await l.exec(`test -s ${DESIRED}`)).code === 0 ? true : undefined), 30_000);
    const presence = await eventually('a presence report', async () => gw.control.presences.find((x) => x.hostId === gw.control.hosts()[0]?.hostId), 30_000);
    tt.ok(presence, 'presence reached the Gateway under the enrolled host');
    tt.ok(gw.requestsTo('state').every((q) => q.authorization), 'every state poll carried the credential');
  });

  let servedVersion = 0;
  await step('the Gateway connects a binding: apply reconciles, the link renews, the agent\'s SDK client is served', async (tt) => {
    gw.control.connectBinding(BINDING, { instanceId: INSTANCE, upstreamUrl: upstream.url() });
    servedVersion = gw.control.version;
    await eventually('the token file', async () => ((await l.exec(`test -s ${TOKEN_FILE}`)).code === 0 ? true : undefined), 60_000);
    tt.equal((await l.sh(`stat -c '%a %U' ${TOKEN_FILE} ${STATE}/mcp-forwarder/instances.json`)).trim(), `600 ${SVC}\n600 ${SVC}`, 'token file and registry: 0600 agent-connectors, written by apply');
    tt.match(JSON.parse(await l.sh(`cat ${APPLIED}`)), { version: servedVersion }, `applied-state: version ${servedVersion}`);
    // A bare ping is the upstream's to refuse (no MCP session): what matters is that the
    // forwarder knows the binding; the SDK client below is the proof that it serves it.
    await eventually('the forwarder to know the binding', async () => ((await forwarderStatus(BINDING)) !== 404 ? true : undefined), 20_000);
    const client = await l.exec(
      `setpriv --reuid=${agent.uid} --regid=${agent.gid} --clear-groups -- env -i PATH=/usr/bin:/bin ${process.execPath} ${LIB_DIR}/${devDir}/lab-mcp-client.mjs http://127.0.0.1:${FORWARDER_PORT}/i/${BINDING}/mcp 'hello from the agent'`,
      60_000,
    );
    tt.equal(client.code, 0, `the SDK client exits 0${client.code === 0 ? '' : `: ${client.stderr.slice(-2000)}`}`);
    tt.same(JSON.parse(client.stdout.trim() || '{}'), { uid: agent.uid, tools: ['echo'], echo: 'echo: hello from the agent' }, 'as the agent UID: tools/list and tools/call through the forwarder');
    const slot = gw.authority.slotState(SLOT);
    tt.ok(upstream.seen.length > 0 && upstream.seen.every((s) => s.valid), 'every upstream request carried a live token of the Gateway');
    tt.same([...new Set(upstream.seen.map((s) => s.tokenId))], [slot?.tokenId], "the token the link renewed for the binding's slot");
  });

  await step('the Gateway drops the binding: the token file is deleted and the forwarder answers 404', async (tt) => {
    gw.control.disconnectBinding(BINDING);
    const version = gw.control.version;
    await eventually('the token file to be deleted', async () => ((await l.exec(`test -e ${TOKEN_FILE}`)).code !== 0 ? true : undefined), 30_000);
    tt.pass(`${TOKEN_FILE} is gone`);
    // apply deletes the token file just before the forwarder reloads its registry: for that
    // moment the route answers 503 token_unavailable (docs/host-link.md), then 404.
    const statuses: number[] = [];
    await eventually('the forwarder to answer 404', async () => {
      const status = await forwarderStatus(BINDING);
      statuses.push(status);
      return status === 404 ? status : undefined;
    }, 30_000);
    tt.same(statuses.filter((s) => s !== 503 && s !== 404), [], `the forwarder answers 404 for the dropped binding, at most 503 before (${statuses.join(' ')})`);
    tt.match(JSON.parse(await l.sh(`cat ${APPLIED}`)), { version }, `applied-state: version ${version}`);
    tt.equal((await l.sh(`ls -A ${STATE}/handoff/inbox`)).trim(), '', 'nothing left in the hand-off inbox');
    const seen = await eventually(
      `presence with state version ${version}`,
      async () => gw.control.presences.find((x) => x.body.stateVersion === version),
      30_000,
    );
    tt.notOk(seen.body.slots.some((s) => s.slot === SLOT), 'presence no longer lists the slot');
    tt.ok(servedVersion < version, 'the versions moved forward');
  });

  await step('no secret in presence, the journal, the console or a file the agent can read', async (tt) => {
    const secrets = [code, credential, ...minted];
    tt.ok(minted.length >= 1, `${minted.length} token(s) minted`);
    const presences = JSON.stringify(gw.control.presences);
    tt.same(secrets.filter((s) => presences.includes(s)).map((s) => `${s.slice(0, 4)}…`), [], 'presence carries no token, credential or code');
    const logs = (await l.exec('journalctl --no-pager -o cat')).stdout + l.consoleLog();
    tt.same(secrets.filter((s) => logs.includes(s)).map((s) => `${s.slice(0, 4)}…`), [], 'the journal and the console carry none');
    // What the agent can read is listed as the agent, then searched here: a secret never
    // goes into a command line, not even a test's grep.
    const listed = await l.exec(
      `setpriv --reuid=${agent.uid} --regid=${agent.gid} --clear-groups -- find ${STATE} /run/credentials /var/lib/private /var/lib/agent-connectors-shims ${etcDir} -type f -readable 2>/dev/null; true`,
    );
    const readable = listed.stdout.split('\n').filter(Boolean);
    const leaking: string[] = [];
    for (const file of readable) {
      const text = (await l.exec(`head -c 1048576 '${file}'`)).stdout;
      if (secrets.some((s) => text.includes(s))) leaking.push(file);
    }
    tt.ok(readable.includes(join(etcDir, 'link.env')), 'the agent can read link.env (0644), so the search did look');
    tt.same(leaking, [], `none of the ${readable.length} files the agent can read holds a secret`);
  });

  await step('systemctl stop agent-connectors.target is clean', async (tt) => {
    await l.sh(`systemctl stop ${TARGET}`);
    for (const unit of UNITS) {
      const p = await l.waitShow(unit, ['ActiveState', 'Result'], (s) => s.ActiveState === 'inactive' || s.ActiveState === 'failed');
      tt.same([p.ActiveState, p.Result], ['inactive', 'success'], `${unit}: inactive, Result=success`);
    }
  });
});
