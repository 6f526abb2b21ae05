import { randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import t from 'tap';
import { FORWARDER_PORT, LAB_QUEUE_ALLOWANCE_MS, labSkipReason, run } from '../../test/support/lab.js';
import { MockRenewGateway } from '../../test/support/mock-renew-gateway.js';
import { unlessMissing } from '../../test/tools/prerequisite.js';
import { BUILD_TIMEOUT_MS, CURRENT_VERSION, currentPackage, debianRoot, debianRootSkipReason, packageLabScratch, PREVIOUS_COMMIT, PREVIOUS_VERSION, previousPackage, previousPackageSkipReason, ROOT_TIMEOUT_MS } from '../helpers/lab-debs.js';
import { checkWith, labSteps, recordMinted, unbridged } from '../helpers/lab-run.js';
import { McpUpstream } from '../helpers/mcp-upstream.js';

/**
 * The .deb as an operator meets it (issue 13), on Debian 13 as it ships (issue 22): the
 * previous release's package, built from git (PREVIOUS_COMMIT, with its own builder; once
 * per machine, then kept in the lab cache: helpers/lab-debs.ts), and this checkout's, and the systemd lab booting a stock trixie root (test/tools/debian-root.sh,
 * a writable overlay of it: the host is never changed) installs the first with dpkg, runs
 * it, upgrades to the second while an MCP client holds its SSE stream, removes and purges
 * it. The upgrade is also 0.1.0's renew-fetch unit becoming the link (issue 19): its
 * enablement, state and renew-fetch.env move over; and the system's Node becoming the
 * carried one (the previous release ran on trixie's nodejs 20.19, which is why the upgrade
 * is tested here and not on Debian 12, whose nodejs 18 it could not run on: labs/deb-bookworm.ts
 * installs this package there fresh). docs/packaging.md has the transcript.
 *
 * The lab's unit path is a directory of its own, so it holds links to where the package
 * puts its units (/usr/lib/systemd/system); they resolve once dpkg has unpacked them.
 */

const PKG = 'agent-connectors';
/** Built from PREVIOUS_COMMIT, the release before the link got its name (0.1.0). */
const V1 = PREVIOUS_VERSION;
const V2 = CURRENT_VERSION;
const TARGET = 'agent-connectors.target';
const OLD_LINK = 'agent-connectors-renew-fetch.service';
const LINK = 'agent-connectors-link.service';
const SERVICES_V1 = ['agent-connectors-forwarder.service', 'agent-connectors-cli-proxy.service', OLD_LINK, 'agent-connectors-renew-apply.service'];
/** The same four, in the same order, after the upgrade. */
const SERVICES = SERVICES_V1.map((u) => (u === OLD_LINK ? LINK : u));
const OLD_LINK_STATE = '/var/lib/private/agent-connectors-renew-fetch';
const LINK_STATE = '/var/lib/private/agent-connectors-link';
const STATE = '/var/lib/agent-connectors';
const SHIMS = '/var/lib/agent-connectors-shims';
const ETC = '/etc/agent-connectors';
const CARRIED_NODE = '/usr/lib/agent-connectors/node/bin/node';
const INSTANCE = 'lab-deb';
const PROVIDER = 'labprov';
const COMMAND = 'labcli';
const BINDING = `deb_${randomBytes(12).toString('base64url')}`;
const ENABLE_LINK = `/etc/systemd/system/multi-user.target.wants/${TARGET}`;
const TARGET_WANTS = `/etc/systemd/system/${TARGET}.wants`;
/** Long enough that no renewal rotates the token during the run: this file is about the package. */
const TOKEN_LIFETIME_MS = 30 * 60_000;
/** The previous release's build installs its dependencies and compiles its dist/ and builder first (one BUILD_TIMEOUT_MS a step), then this checkout's, then the root. */
const BUDGET_MS = 4 * BUILD_TIMEOUT_MS + ROOT_TIMEOUT_MS + 5 * 60_000;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function skipReason(): string | undefined {
  const lab = labSkipReason();
  if (lab) return lab;
  const root = debianRootSkipReason();
  if (root) return root;
  return previousPackageSkipReason();
}

t.setTimeout(BUDGET_MS + LAB_QUEUE_ALLOWANCE_MS);

t.test('the .deb: install, serve, upgrade under a live stream, remove, purge', { skip: unlessMissing(t, skipReason()), timeout: BUDGET_MS + LAB_QUEUE_ALLOWANCE_MS }, async (t) => {
  const { work, debs, unitDir, boot } = packageLabScratch(t, 'ac-deb-lab-');

  const HOST_PATHS = ['/usr/lib/agent-connectors', '/usr/bin/agent-connectors', `/usr/lib/systemd/system/${TARGET}`, ETC];
  const hostBefore = HOST_PATHS.filter((p) => existsSync(p));

  // ---- host side: the two packages, the Gateway, the upstream -----------------------------
  // One after the other: two builds at once on a busy two-core machine ran each past its timeout.
  const previous = await previousPackage();
  const current = previous.ok ? await currentPackage() : { ok: false, log: 'not built', deb: '', arch: '' };
  // The previous release was Architecture: all (on the system's Node); this one carries its own.
  const debOf = (v: string): string => join(debs, v === V1 ? `${PKG}_${v}_all.deb` : `${PKG}_${v}_${current.arch}.deb`);
  if (previous.ok) copyFileSync(previous.deb, debOf(V1));
  if (current.ok) copyFileSync(current.deb, debOf(V2));
  for (const [v, built] of [[V1, previous], [V2, current]] as const) {
    if (!built.ok || !existsSync(debOf(v))) {
      t.fail(`building ${v} failed:\n${built.log}`);
      return;
    }
    t.comment(built.log.trim().split('\n').at(-1) ?? '');
  }
  const trixie = await debianRoot('trixie');
  t.comment(trixie.log);
  if (!trixie.root) {
    t.fail(`no Debian 13 root: ${trixie.log}`);
    return;
  }
  const unitsOf = async (v: string): Promise<string[]> =>
    [...(await run('dpkg-deb', ['-c', debOf(v)])).stdout.matchAll(/ \.\/usr\/lib\/systemd\/system\/(\S+)$/gm)].map((m) => m[1] ?? '').sort();
  const units = await unitsOf(V1);
  t.same(units, [TARGET, ...SERVICES_V1].sort(), `${V1} (${PREVIOUS_COMMIT}) ships the target and the four services, the link as ${OLD_LINK}`);
  t.same(await unitsOf(V2), [TARGET, ...SERVICES].sort(), `${V2} ships them with the link as ${LINK}`);
  // Links for both packages' units: the new one's resolves once dpkg has unpacked it.
  for (const unit of new Set([...units, LINK])) symlinkSync(`/usr/lib/systemd/system/${unit}`, join(unitDir, unit));

  const credential = `hostcred-${randomBytes(24).toString('base64url')}`;
  const gw = await MockRenewGateway.start({ credential, tokenLifetimeMs: TOKEN_LIFETIME_MS, slots: [`instance:${INSTANCE}`, `cli:${PROVIDER}`] });
  t.teardown(() => gw.close());
  const minted = recordMinted(gw.authority);
  const upstream = await McpUpstream.start({ tools: ['echo'], check: checkWith(gw.authority, minted) });
  t.teardown(() => upstream.close());

  const l = await boot(trixie.root, Math.ceil(BUDGET_MS / 1000));
  if (!l) return;

  const step = labSteps(t);
  // Both packages' Depends from Debian 13 itself: nodejs 20.19 for the previous release.
  const dpkgI = 'dpkg -i';
  await step('a stock Debian 13 root, with its own nodejs for the previous release', async (tt) => {
    tt.match(await l.sh('cat /etc/debian_version'), /^13\./, 'Debian 13');
    tt.match(await l.sh("dpkg-query -W -f '${Version}' nodejs"), /^20\./, "trixie's nodejs 20, from Debian");
    tt.equal((await l.exec('test -e /usr/lib/agent-connectors')).code, 1, 'no agent-connectors yet');
  });
  const states = async (services = SERVICES): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    for (const unit of services) out[unit] = (await l.show(unit, ['ActiveState'])).ActiveState ?? '';
    return out;
  };
  const allInactive = Object.fromEntries(SERVICES_V1.map((u) => [u, 'inactive']));
  /** What every dpkg run printed (maintainer scripts included). */
  const dpkgOutput: string[] = [];
  const dpkg = async (args: string): Promise<string> => {
    const out = await l.sh(`${args} 2>&1`, 120_000);
    dpkgOutput.push(out);
    return out;
  };
  const exists = async (path: string): Promise<boolean> => (await l.exec(`test -e '${path}' || test -L '${path}'`)).code === 0;
  /** Checksums of the state an upgrade or a remove must keep (the env files: the upgrade merges them, checked on their own). */
  const keptState = async (): Promise<string> =>
    l.sh(`cd / && sha256sum ${STATE}/mcp-forwarder/* ${STATE}/cli-proxy/* ${STATE}/handoff/slots/* ${SHIMS}/* ${ETC}/host-credential`);
  /** The link's private state (renewal's requestIds), relative to its directory. */
  const privateState = async (dir: string): Promise<string> => l.sh(`cd ${dir} && find . -type f | sort | xargs -r sha256sum`);
  /**
   * The requestIds and token ids the link's private state holds, whatever its files: since
   * session 12 the link folds a previous version's per-slot records into its ledger at start
   * (docs/host-link.md, "the ledger"), so the files change and their content must not.
   */
  const privateIds = async (dir: string): Promise<string> =>
    l.sh(`cd ${dir} && find . -type f -print0 | xargs -0r cat | grep -o '"\\(requestId\\|tokenId\\)":"[^"]*"' | sort -u || true`);

  await step(`dpkg -i ${V1}: users, directories and units in place, nothing started or enabled`, async (tt) => {
    const out = await dpkg(`${dpkgI} ${debOf(V1)}`);
    tt.match(out, new RegExp(`Setting up ${PKG} \\(${V1}\\)`), 'dpkg configured the package');
    tt.equal((await l.sh(`dpkg-query -W -f '\${Status} \${Version}' ${PKG}`)).trim(), `install ok installed ${V1}`, 'dpkg: installed');
    tt.equal((await l.exec('getent passwd agent-connectors')).code, 0, 'postinst created the service user (systemd-sysusers)');
    tt.equal((await l.exec('getent group agent-connectors-renew')).code, 0, 'and the hand-off group');
    const modes = await l.sh(`stat -c '%n %a %U %G' ${STATE} ${STATE}/mcp-forwarder ${STATE}/handoff ${SHIMS} ${ETC}`);
    tt.same(modes.trim().split('\n'), [
      `${STATE} 750 agent-connectors agent-connectors-renew`,
      `${STATE}/mcp-forwarder 700 agent-connectors agent-connectors`,
      `${STATE}/handoff 2770 agent-connectors agent-connectors-renew`,
      `${SHIMS} 755 agent-connectors agent-connectors`,
      `${ETC} 750 root agent-connectors`,
    ], 'postinst created the directories (systemd-tmpfiles --create)');
    tt.equal((await l.exec(`ls -A ${ETC}`)).stdout, '', `the package puts no file in ${ETC}`);
    tt.equal((await l.sh('agent-connectors --version')).trim(), V1, '/usr/bin/agent-connectors runs the packaged CLI, which reports the package version');
    for (const unit of [TARGET, ...SERVICES_V1]) tt.equal((await l.show(unit, ['LoadState'])).LoadState, 'loaded', `${unit}: loaded (postinst ran daemon-reload)`);
    tt.same(await states(SERVICES_V1), allInactive, 'a first install starts nothing: the host has no credential yet');
    tt.equal((await l.exec(`systemctl is-enabled ${TARGET}`)).stdout.trim(), 'disabled', 'and enables nothing');
  });

  const linkEnvBefore = `AGENT_CONNECTORS_GATEWAY_URL=${gw.url}\n`;
  await step("the operator's steps: a binding, a provider's shim, credential, Gateway URL (renew-fetch.env and link.env), enable --now, the link enabled on its own", async (tt) => {
    tt.equal((await l.sh(`agent-connectors bind ${BINDING} --instance-id ${INSTANCE} --upstream ${upstream.url()}`)).trim(), BINDING, 'bind prints the binding id');
    const catalog = JSON.stringify({
      [PROVIDER]: {
        upstream: 'http://127.0.0.1:9/api',
        tokenFile: `${STATE}/cli-proxy/${PROVIDER}.token`,
        inject: { type: 'header', name: 'authorization', value: 'Bearer {token}' },
        commands: [{ name: COMMAND }],
      },
    });
    await l.sh(`umask 077 && printf '%s\\n' '${catalog}' > ${STATE}/cli-proxy/providers.json && chown agent-connectors:agent-connectors ${STATE}/cli-proxy/providers.json`);
    tt.match(await l.sh('agent-connectors shims install'), new RegExp(`shims in ${SHIMS}: ${COMMAND}`), `the shim is rendered into ${SHIMS}`);
    // After bind: with a host credential in place, bind and unbind take the host for an enrolled one.
    // The credential goes through a 0600 file the lab sees (its WORK directory), never
    // through a command line (release/lab-target.ts does the same).
    const credentialFile = join(work, 'host-credential');
    writeFileSync(credentialFile, `${credential}\n`, { mode: 0o600 });
    await l.sh(
      `install -m 600 ${credentialFile} ${ETC}/host-credential && rm -f ${credentialFile} && ` +
        `(umask 077 && printf '# the operator\\047s\\nAGENT_CONNECTORS_GATEWAY_URL=%s\\nAGENT_CONNECTORS_LAB_MARK=from-renew-fetch\\n' '${gw.url}' > ${ETC}/renew-fetch.env) && ` +
        `printf '%s' '${linkEnvBefore}' > ${ETC}/link.env`,
    );
    tt.notOk(existsSync(credentialFile), 'the hand-over file is gone');
    tt.equal((await l.sh(`stat -c '%a %U' ${ETC}/host-credential`)).trim(), '600 root', 'the credential: 0600 root');
    // 0.1.0's unit enabled on its own too (its [Install] WantedBy= the target): the upgrade must carry that over.
    await l.sh(`systemctl enable --now ${TARGET} 2>&1 && systemctl enable ${OLD_LINK} 2>&1`);
    // Enablement as systemd acts on it at boot: the [Install] symlink and the unit it names.
    // (Not `systemctl is-enabled`: in the lab, whose unit path is /lib, a unit the package put
    // in /usr/lib is enabled through a linked unit file, and is-enabled says "disabled".)
    tt.equal((await l.exec(`test -e ${TARGET_WANTS}/${OLD_LINK}`)).code, 0, `${OLD_LINK}: enabled (${TARGET_WANTS}/${OLD_LINK})`);
    for (const unit of SERVICES_V1) {
      const p = await l.waitShow(unit, ['ActiveState', 'SubState'], (s) => s.ActiveState === 'active' || s.ActiveState === 'failed');
      tt.same([p.ActiveState, p.SubState], ['active', 'running'], `${unit}: active (running)`);
    }
    tt.ok(await exists(ENABLE_LINK), `enabled: ${ENABLE_LINK}`);
    // The first token: fetch renews the new slots at once, apply writes the token files.
    await l.sh(`until [ -s ${STATE}/mcp-forwarder/${INSTANCE}.token ] && [ -s ${STATE}/cli-proxy/${PROVIDER}.token ]; do sleep 0.2; done`, 30_000);
    tt.pass('renewal delivered both tokens');
  });

  const client = new Client({ name: 'deb-lab-agent', version: '0.0.0' });
  // The stream must outlast a restart: reconnect for up to about a minute.
  const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${FORWARDER_PORT}/i/${BINDING}/mcp`), {
    reconnectionOptions: { initialReconnectionDelay: 300, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5, maxRetries: 40 },
  });
  t.teardown(() => client.close().catch(() => undefined));
  let sessionId: string | undefined;
  const streamsOpened = (): number => upstream.seen.filter((s) => s.method === 'GET' && s.sessionId === sessionId && s.valid).length;
  const waitStreams = async (n: number, timeoutMs: number): Promise<number> => {
    const deadline = Date.now() + timeoutMs;
    while (streamsOpened() < n && Date.now() < deadline) await sleep(100);
    return streamsOpened();
  };
  const echo = async (text: string): Promise<string> => {
    const r = await client.callTool({ name: 'echo', arguments: { text } });
    return ((r.content ?? []) as Array<{ text?: string }>)[0]?.text ?? '';
  };

  await step('an MCP client lists the tools and holds its SSE stream open', async (tt) => {
    await client.connect(transport);
    sessionId = transport.sessionId;
    tt.ok(sessionId, 'a session');
    tt.same((await client.listTools()).tools.map((x) => x.name), ['echo'], 'tools/list through the packaged forwarder');
    tt.equal(await waitStreams(1, 15_000), 1, 'the standalone GET stream reached the Gateway');
  });

  await step(`dpkg -i ${V2} while the stream is open: services restarted onto ${V2}, state and shims kept, the client reconnects; renew-fetch became the link`, async (tt) => {
    const before: Record<string, string> = {};
    for (const [i, unit] of SERVICES.entries()) before[unit] = (await l.show(SERVICES_V1[i] ?? unit, ['MainPID'])).MainPID ?? '';
    const kept = await keptState();
    const privateBefore = await privateState(`${OLD_LINK_STATE}/renew-fetch`);
    tt.match(privateBefore, /slots\//, `the old link keeps its requestIds in ${OLD_LINK_STATE}/renew-fetch`);
    const idsBefore = await privateIds(`${OLD_LINK_STATE}/renew-fetch`);
    const linkUid = async (unit: string): Promise<string> => (await l.sh(`stat -c %u /proc/${(await l.show(unit, ['MainPID'])).MainPID ?? 0}`)).trim();
    const uidBefore = await linkUid(OLD_LINK);
    const streams = streamsOpened();
    const out = await dpkg(`${dpkgI} ${debOf(V2)}`);
    tt.match(out, new RegExp(`Unpacking ${PKG} \\(${V2}\\) over \\(${V1}\\)`), 'dpkg upgraded');
    tt.match(out, new RegExp(`Setting up ${PKG} \\(${V2}\\)`), 'and configured it');
    tt.match(out, /agent-connectors: move state \/var\/lib\/private\/agent-connectors-link/, 'postinst says what it moved');
    for (const unit of SERVICES) {
      const p = await l.waitShow(unit, ['ActiveState', 'SubState', 'MainPID'], (s) => s.ActiveState === 'active' && s.MainPID !== before[unit] && s.MainPID !== '0', 30_000);
      tt.same([p.ActiveState, p.SubState], ['active', 'running'], `${unit}: active (running), a new process (pid ${before[unit]} → ${p.MainPID})`);
    }
    const exes = await l.sh(`for u in ${SERVICES.join(' ')}; do readlink /proc/$(systemctl show -p MainPID --value $u)/exe; done`);
    tt.same([...new Set(exes.trim().split('\n'))], [CARRIED_NODE], `every service now runs on the carried Node (${CARRIED_NODE}), not trixie's /usr/bin/node`);
    const old = await l.show(OLD_LINK, ['LoadState', 'ActiveState']);
    tt.same([old.LoadState, old.ActiveState], ['not-found', 'inactive'], `${OLD_LINK}: stopped and gone`);
    tt.equal((await l.exec(`test -e ${TARGET_WANTS}/${LINK}`)).code, 0, `${LINK}: enabled, as ${OLD_LINK} was (${TARGET_WANTS}/${LINK} names an existing unit)`);
    tt.equal((await l.sh(`find /etc/systemd/system -name ${OLD_LINK}`)).trim(), '', "no enablement link of the old unit is left");
    tt.notOk(await exists(OLD_LINK_STATE), `${OLD_LINK_STATE} moved`);
    tt.equal(await privateIds(`${LINK_STATE}/link`), idsBefore, `the requestIds are in ${LINK_STATE}/link, unchanged (the link renamed renew-fetch/ at start, then folded its records into its ledger)`);
    tt.notOk(await exists(`${ETC}/renew-fetch.env`), 'renew-fetch.env is gone');
    tt.equal(
      await l.sh(`cat ${ETC}/link.env`),
      `${linkEnvBefore}# From renew-fetch.env (agent-connectors 0.1.0), merged on upgrade; docs/packaging.md.\n` +
        `# the operator's\n# (link.env sets AGENT_CONNECTORS_GATEWAY_URL above) AGENT_CONNECTORS_GATEWAY_URL=${gw.url}\nAGENT_CONNECTORS_LAB_MARK=from-renew-fetch\n`,
      "link.env: its own lines, then every line of renew-fetch.env (a key link.env sets as a comment)",
    );
    tt.equal((await l.sh(`stat -c '%a %U' ${ETC}/link.env`)).trim(), '600 root', "link.env took renew-fetch.env's stricter mode");
    tt.equal(
      (await l.sh(`stat -c '%a %U %G' ${STATE}/handoff`)).trim(),
      '3770 agent-connectors agent-connectors-renew',
      "the hand-off root is sticky now (0.1.0's 2770 given the new mode by systemd-tmpfiles): the link cannot rename apply's directories",
    );
    tt.equal(await linkUid(LINK), uidBefore, `the link kept its dynamic UID (${uidBefore}): it can still replace the files it wrote in the sticky root`);
    const linkPid = (await l.show(LINK, ['MainPID'])).MainPID ?? '';
    tt.equal((await l.exec(`tr '\\0' '\\n' < /proc/${linkPid}/environ | grep -x AGENT_CONNECTORS_LAB_MARK=from-renew-fetch`)).code, 0, "the link runs with renew-fetch.env's setting, now from link.env");
    const health = (await (await fetch(`http://127.0.0.1:${FORWARDER_PORT}/healthz`)).json()) as { version?: string; instances?: number };
    tt.match(health, { version: V2, instances: 1 }, `the forwarder now runs ${V2}, with its binding`);
    tt.equal(await keptState(), kept, `registry, catalog, tokens, slots, the shim and ${ETC} are unchanged`);
    tt.ok(await exists(ENABLE_LINK), 'still enabled');
    tt.ok((await waitStreams(streams + 1, 60_000)) > streams, `the client reopened its SSE stream in the same session (${streams} → ${streamsOpened()})`);
    tt.equal(await echo('after the upgrade'), 'echo: after the upgrade', 'tools/call in the same session');
    tt.same(unbridged(upstream.seen.filter((s) => s.sessionId === sessionId)), [], 'every upstream request carried a minted token, a superseded one retried with the renewed token');
    await client.close();
  });

  await step('dpkg -r: services stopped, the files gone, state, configuration and users kept', async (tt) => {
    const kept = await keptState();
    const out = await dpkg(`dpkg -r ${PKG}`);
    tt.match(out, new RegExp(`Removing ${PKG} \\(${V2}\\)`), 'dpkg removed it');
    tt.equal((await l.sh(`dpkg-query -W -f '\${Status}' ${PKG}`)).trim(), 'deinstall ok config-files', 'dpkg: removed, not purged');
    for (const unit of SERVICES) {
      const p = await l.show(unit, ['ActiveState', 'LoadState']);
      tt.same([p.ActiveState, p.LoadState], ['inactive', 'not-found'], `${unit}: stopped and unloaded`);
    }
    for (const path of ['/usr/lib/agent-connectors', '/usr/bin/agent-connectors', `/usr/lib/systemd/system/${TARGET}`, '/usr/lib/sysusers.d/agent-connectors.conf', '/usr/lib/tmpfiles.d/agent-connectors.conf']) {
      tt.notOk(await exists(path), `${path} is gone`);
    }
    tt.equal(await keptState(), kept, 'state, shims and /etc/agent-connectors are kept');
    tt.ok(await exists(LINK_STATE), "the link's private state is kept");
    tt.equal((await l.exec('getent passwd agent-connectors')).code, 0, 'the service user is kept');
    tt.ok(await exists(ENABLE_LINK), "the operator's enablement link is kept (dangling until a reinstall)");
  });

  await step('dpkg -P: nothing of ours is left', async (tt) => {
    const out = await dpkg(`dpkg -P ${PKG}`);
    tt.match(out, new RegExp(`Purging configuration files for ${PKG} \\(${V2}\\)`), 'dpkg purged it');
    tt.not((await l.exec(`dpkg-query -W ${PKG}`)).code, 0, 'dpkg no longer knows the package');
    const left = await l.sh("find /etc /usr /var /opt \\( -name '*agent-connectors*' -o -name '*agent_connectors*' \\) -print 2>/dev/null | sort");
    tt.equal(left.trim(), '', 'no file or directory named after us under /etc, /usr, /var, /opt');
    for (const name of ['agent-connectors']) tt.not((await l.exec(`getent passwd ${name}`)).code, 0, `user ${name} removed`);
    for (const name of ['agent-connectors', 'agent-connectors-renew']) tt.not((await l.exec(`getent group ${name}`)).code, 0, `group ${name} removed`);
    tt.same(await states(), Object.fromEntries(SERVICES.map((u) => [u, 'inactive'])), 'nothing of ours runs');
  });

  await step('no token and no credential in the journal, the console, dpkg\'s output or any command line run in the lab', async (tt) => {
    const all = [await l.sh('journalctl --no-pager -o cat'), l.consoleLog(), ...dpkgOutput, ...l.output, ...l.commands].join('\n');
    tt.ok(minted.length >= 2, `${minted.length} tokens were minted`);
    tt.same([credential, ...minted].filter((x) => all.includes(x)).map((x) => `${x.slice(0, 6)}…`), [], 'none appears');
  });

  await step('the host itself was never touched', async (tt) => {
    tt.same(HOST_PATHS.filter((p) => existsSync(p)), hostBefore, `host: ${HOST_PATHS.join(', ')} as they were`);
    tt.ok(statSync(join(work, 'overlay/root/upper')).isDirectory(), "the lab's changes went to its overlay of the root");
  });
});
