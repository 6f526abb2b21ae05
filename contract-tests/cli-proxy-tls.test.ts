/**
 * TLS mode (SPEC §10, issue 20): real curl, run as the agent UID through a rendered shim,
 * reaches a fake SaaS served under a real host name (its own CA, through the cli-proxy's
 * test aids `--resolve` and `--upstream-ca`). The catalog host is intercepted and gets the
 * token; another host is tunnelled untouched; a non-agent UID's CONNECT is refused; the
 * CLI CA's key stays with the cli-proxy's user.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { ensureAgentUser, existingUser, runAsAgent, snapshotProcsOf, type AgentRunResult, type ProcSnapshot } from '../test/support/agent-user.js';
import { leakedSecrets, startCli, writeToken } from '../test/support/cli-proc.js';
import { startProxy } from '../test/support/proxy-rig.js';
import { issueServerCert, makeTestCa, tlsLabDirs } from '../test/support/test-ca.js';
import { whenRootWithTools } from '../test/tools/prerequisite.js';

const TOKEN = `tok-tls-REAL-${process.pid}-9c2e41`;
const PLACEHOLDER = 'ghp_agentconnectors000000000000000000000';
const CATALOG_HOST = 'api.github.com';
const OTHER_HOST = 'example.org';

const missing = ['curl', 'openssl'].filter((tool) => spawnSync(tool, ['--version']).error !== undefined);
await whenRootWithTools(t, missing, 'curl, openssl', main);

interface FakeSaas {
  server: Server;
  port: number;
  requests: Array<{ url: string; headers: IncomingHttpHeaders; snapshot: ProcSnapshot[] }>;
}

/** An https server for `host`, its certificate from the test's own CA. */
async function fakeSaas(dir: string, host: string, agentUid: number, answer: (headers: IncomingHttpHeaders) => [number, unknown]): Promise<FakeSaas> {
  const fake: FakeSaas = { server: createServer(issueServerCert(dir, host, [host])), port: 0, requests: [] };
  fake.server.on('request', (req, res) => {
    fake.requests.push({ url: req.url ?? '', headers: req.headers, snapshot: snapshotProcsOf(agentUid) });
    const [status, body] = answer(req.headers);
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  });
  await new Promise<void>((resolve) => fake.server.listen(0, '127.0.0.1', resolve));
  fake.port = (fake.server.address() as AddressInfo).port;
  t.teardown(() => {
    fake.server.closeAllConnections();
    fake.server.close();
  });
  return fake;
}

async function main(): Promise<void> {
  const agent = ensureAgentUser();
  const nobody = existingUser('nobody');

  const { base, state, pki, shimDir, bundle } = tlsLabDirs(t, 'ac-cli-tls-');
  const binDir = join(base, 'bin');
  mkdirSync(binDir, { mode: 0o755 });
  chmodSync(binDir, 0o755);
  // The CLI: real curl, behind a name of its own (a catalog must not shim the host's curl)
  // that reads its credential from the environment as gh does (curl 7.x cannot itself).
  const curlPath = execFileSync('sh', ['-c', 'command -v curl'], { encoding: 'utf8' }).trim();
  writeFileSync(join(binDir, 'ghcurl'), `#!/bin/sh\nexec ${curlPath} -H "Authorization: token $GH_TOKEN" "$@"\n`, { mode: 0o755 });
  chmodSync(join(binDir, 'ghcurl'), 0o755);
  const agentUsers = join(base, 'agent-users');
  writeFileSync(agentUsers, `${agent.name}\n`, { mode: 0o644 });

  // The fake SaaS's own CA: the proxy trusts it only through --upstream-ca.
  makeTestCa(pki, 'fake SaaS test CA');
  const testCa = join(base, 'test-ca.pem');
  copyFileSync(join(pki, 'ca.pem'), testCa);
  chmodSync(testCa, 0o644);

  const saas = await fakeSaas(pki, CATALOG_HOST, agent.uid, (h) => (h.authorization === `token ${TOKEN}` ? [200, { login: 'octocat' }] : [401, { message: 'Bad credentials' }]));
  const other = await fakeSaas(pki, OTHER_HOST, agent.uid, () => [200, { site: 'other' }]);

  const tokenFile = join(state, 'cli-proxy', 'gh.token');
  writeToken(tokenFile, TOKEN);
  const catalog = {
    gh: {
      mode: 'tls',
      hosts: [CATALOG_HOST, 'uploads.github.com'],
      tokenFile,
      inject: { type: 'header', name: 'Authorization', value: 'token {token}' },
      placeholder: PLACEHOLDER,
      commands: [{ name: 'ghcurl', env: { GH_TOKEN: '{placeholder}' } }],
    },
  };
  const proxy = await startProxy(t, 'cli-proxy', {
    stateDir: state,
    config: catalog,
    args: [
      '--agent-users-file', agentUsers,
      '--ca-bundle', bundle,
      '--resolve', `${CATALOG_HOST}:443:127.0.0.1:${saas.port}`,
      '--resolve', `${OTHER_HOST}:443:127.0.0.1:${other.port}`,
      '--upstream-ca', testCa,
    ],
  });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  const install = startCli(['shims', 'install', '--dir', shimDir, '--proxy-url', proxy.base, '--state-dir', state, '--ca-bundle', bundle]);
  const code = (await install.exited).code;
  if (code !== 0) throw new Error(`shims install exited ${code}: ${install.lines.join('\n')}`);

  const env = { PATH: [shimDir, binDir, '/usr/bin', '/bin'].join(':'), HOME: '/nonexistent', LANG: 'C.UTF-8' };
  const leaksIn = (r: AgentRunResult): string[] => leakedSecrets(`${r.stdout}\n${r.stderr}`);

  t.test('the CLI CA: key 0600 in a 0700 directory, unreadable by the agent; the bundle readable', async (t) => {
    const caDir = join(state, 'cli-ca');
    t.equal(statSync(caDir).mode & 0o777, 0o700, 'CA directory 0700');
    t.equal(statSync(join(caDir, 'ca.pem')).mode & 0o777, 0o600, 'CA key file 0600');
    t.match(readFileSync(join(caDir, 'ca.pem'), 'utf8'), /BEGIN PRIVATE KEY/, 'it holds the private key');
    const r = await runAsAgent(agent, 'cat "$1"', { env, args: [join(caDir, 'ca.pem')] });
    t.not(r.code, 0, 'the agent cannot read the CA key');
    t.notMatch(r.stdout, /PRIVATE KEY/);
    const ok = await runAsAgent(agent, 'grep -c "BEGIN CERTIFICATE" "$1"', { env, args: [bundle] });
    t.equal(ok.code, 0, 'the agent reads the bundle');
    t.ok(Number(ok.stdout.trim()) > 1, 'the bundle holds the system CAs and ours');
    t.notMatch(readFileSync(bundle, 'utf8'), /PRIVATE KEY/, 'and never the CA\'s key');
    t.notMatch(readFileSync(join(caDir, 'ca-cert.pem'), 'utf8'), /PRIVATE KEY/, 'nor does the public certificate file');
    t.equal(statSync(bundle).mode & 0o777, 0o644);
  });

  t.test('curl through its shim: the catalog host is intercepted and the SaaS sees the real token', async (t) => {
    const before = saas.requests.length;
    const r = await runAsAgent(agent, 'ghcurl -sS --fail-with-body "$1"', { env, args: [`https://${CATALOG_HOST}/user?per_page=5`] });
    t.equal(r.code, 0, `curl exit 0 (${r.stderr.trim()})`);
    t.same(JSON.parse(r.stdout), { login: 'octocat' }, 'the SaaS answered through the proxy');
    t.equal(saas.requests.length, before + 1, 'one call reached the SaaS');
    const seen = saas.requests[before];
    t.equal(seen?.headers.authorization, `token ${TOKEN}`, 'the SaaS saw the real token, not the placeholder');
    t.equal(seen?.url, '/user?per_page=5', 'path and query unchanged');
    t.equal(seen?.headers.host, CATALOG_HOST, 'Host is the real host name');
    t.same(leaksIn(r), [], 'no token in curl\'s output');
    const procs = (seen?.snapshot ?? []).map((p) => `${p.cmdline}\n${p.environ}`).join('\n');
    t.match(procs, `GH_TOKEN=${PLACEHOLDER}`, 'curl ran with the provider\'s placeholder');
    t.match(procs, `HTTPS_PROXY=${proxy.base}`, 'and the cli-proxy as its HTTPS proxy');
    for (const v of ['SSL_CERT_FILE', 'CURL_CA_BUNDLE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'GIT_SSL_CAINFO']) t.match(procs, `${v}=${bundle}`, `${v} = the bundle`);
    t.same(leakedSecrets(procs), [], 'no agent-UID process held the token in argv or env');
    for (const name of readdirSync(shimDir)) t.same(leakedSecrets(readFileSync(join(shimDir, name), 'utf8')), [], `${name} holds no token`);
    const line = await proxy.waitForLog((l) => l.provider === 'gh' && l.status === 200);
    t.equal(line.path, '/user', 'the access line names the provider and the path, never the query');
  });

  t.test('a host outside the catalog is tunnelled: the fake\'s own certificate, no token', async (t) => {
    const before = other.requests.length;
    // Verified against the test CA alone: it succeeds only if the TLS is the fake's own.
    const r = await runAsAgent(agent, 'ghcurl -sS --fail-with-body --cacert "$2" "$1"', { env, args: [`https://${OTHER_HOST}/hello`, testCa] });
    t.equal(r.code, 0, `curl exit 0 (${r.stderr.trim()})`);
    t.same(JSON.parse(r.stdout), { site: 'other' });
    const seen = other.requests[before];
    t.equal(seen?.headers.authorization, `token ${PLACEHOLDER}`, 'the other host got what curl sent, never the token');
    const line = await proxy.waitForLog((l) => l.outcome === 'tunnel' && l.host === OTHER_HOST);
    t.ok(line, 'logged as a tunnel');
    const intercepted = await runAsAgent(agent, 'ghcurl -sS --cacert "$2" "$1"', { env, args: [`https://${CATALOG_HOST}/user`, testCa] });
    t.not(intercepted.code, 0, 'the catalog host, by contrast, is not the fake\'s certificate (intercepted)');
  });

  t.test('inside an intercepted tunnel, a request for another Host is refused and gets no token', async (t) => {
    const before = saas.requests.length;
    const r = await runAsAgent(agent, 'ghcurl -sS -H "Host: evil.example" "$1"', { env, args: [`https://${CATALOG_HOST}/user`] });
    t.match(r.stdout, /"error":"forbidden_host"/, '403 forbidden_host');
    t.equal(saas.requests.length, before, 'nothing reached the SaaS');
  });

  t.test('a tunnel to a loopback address is refused: the proxy\'s UID is no way into local services', async (t) => {
    for (const target of [`127.0.0.1:${proxy.port}`, `localhost:${proxy.port}`]) {
      const r = await runAsAgent(agent, 'curl -sS -x "$2" -k "$1"', { env: { PATH: '/usr/bin:/bin' }, args: [`https://${target}/healthz`, proxy.base] });
      t.not(r.code, 0, `${target}: curl fails`);
      t.match(r.stderr, /403/, `${target}: the proxy answered 403`);
    }
  });

  t.test('a UID that is not an agent user gets 403 for CONNECT', async (t) => {
    const before = saas.requests.length;
    const r = await runAsAgent(nobody, 'curl -sS -x "$2" --cacert "$3" "$1"', { env: { PATH: '/usr/bin:/bin' }, args: [`https://${CATALOG_HOST}/user`, proxy.base, bundle] });
    t.not(r.code, 0, 'curl fails');
    t.match(r.stderr, /403/, 'the proxy answered 403');
    t.equal(saas.requests.length, before, 'nothing reached the SaaS');
  });

  t.test('no token in any line the proxy printed', async (t) => {
    t.same(leakedSecrets(proxy.lines.join('\n')), []);
  });
}
