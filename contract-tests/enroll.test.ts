import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { CLI } from '../test/support/cli-proc.js';
import { MockHostGateway } from '../test/support/mock-host-gateway.js';
import { tempDir } from '../test/support/temp-dir.js';
import type { TapTest } from '../test/support/tap.js';

/*
 * enroll / unenroll, black-box against the built CLI and a MockHostGateway (SPEC §8): the
 * pairing code goes in on stdin only; the credential lands 0600 and link.env 0644; retries
 * keep one requestId; a refused code, an unreachable Gateway and an enrolled host each
 * fail with their cause and fix; systemctl is a fake on PATH that records its argv. Every
 * argv and every line of output is searched for every code and credential at the end.
 */

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  argv: string[];
}

const runs: Run[] = [];
const secrets = new Set<string>();

async function cli(args: string[], options: { stdin?: string; env?: NodeJS.ProcessEnv } = {}): Promise<Run> {
  const argv = ['-u', 'NODE_OPTIONS', process.execPath, CLI, ...args];
  const child = spawn('env', argv, {
    env: { ...process.env, ...options.env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdin.end(options.stdin ?? '');
  const [code] = (await once(child, 'close')) as [number | null];
  const run = { code, stdout, stderr, argv };
  runs.push(run);
  return run;
}

function readCredential(path: string): string {
  const cred = readFileSync(path, 'utf8').trim();
  secrets.add(cred);
  return cred;
}

async function setup(t: TapTest) {
  const gw = await MockHostGateway.start();
  t.teardown(() => gw.close());
  const dir = tempDir('ac-enroll-', t);
  // A fake systemctl first on PATH: logs its argv, reports the unit active.
  mkdirSync(join(dir, 'bin'));
  const log = join(dir, 'systemctl.log');
  writeFileSync(join(dir, 'bin', 'systemctl'), `#!/bin/sh\necho "$*" >> '${log}'\ncase "$1" in is-active) exit 0;; esac\nexit 0\n`);
  chmodSync(join(dir, 'bin', 'systemctl'), 0o755);
  const credential = join(dir, 'etc', 'host-credential');
  const env = { PATH: `${join(dir, 'bin')}:${process.env.PATH ?? ''}`, AGENT_CONNECTORS_TEST_HOOKS: 'systemd:present' };
  const code = (): string => {
    const c = gw.control.issuePairingCode();
    secrets.add(c);
    return c;
  };
  const systemctlCalls = (): string[] => (existsSync(log) ? readFileSync(log, 'utf8').trim().split('\n') : []);
  return { gw, dir, credential, env, code, systemctlCalls, linkEnv: join(dir, 'etc', 'link.env') };
}

t.test('enrol with the code on stdin: credential 0600, link.env 0644, the link unit restarted', async (t) => {
  const s = await setup(t);
  const r = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: `${s.code()}\n`, env: s.env });
  t.equal(r.code, 0, r.stderr);
  const cred = readCredential(s.credential);
  t.equal(statSync(s.credential).mode & 0o777, 0o600, 'credential 0600');
  t.equal(statSync(s.credential).uid, process.getuid?.(), 'owned by the user who ran enroll (root in CI)');
  t.ok(s.gw.control.hostOf(cred), 'the stored credential is the one the Gateway minted');
  const host = s.gw.control.hosts().find((h) => h.hostname !== null);
  t.equal(statSync(s.linkEnv).mode & 0o777, 0o644, 'link.env 0644');
  t.match(readFileSync(s.linkEnv, 'utf8'), new RegExp(`^AGENT_CONNECTORS_GATEWAY_URL=${s.gw.url}$`, 'm'));
  t.match(readFileSync(s.linkEnv, 'utf8'), new RegExp(`^AGENT_CONNECTORS_HOST_ID=${host?.hostId}$`, 'm'));
  t.notOk(existsSync(`${s.credential}.enroll-pending`), 'no pending requestId left');
  t.same(s.systemctlCalls(), ['try-restart agent-connectors-link.service', 'is-active agent-connectors-link.service']);
  t.match(r.stdout, /enrolled as host host_[0-9a-f]+/);
  t.match(r.stdout, /restarted agent-connectors-link\.service/);
});

t.test('no systemd: says how to start the link, still exits 0', async (t) => {
  const s = await setup(t);
  const r = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], {
    stdin: s.code(),
    env: { ...s.env, AGENT_CONNECTORS_TEST_HOOKS: 'systemd:absent' },
  });
  t.equal(r.code, 0, r.stderr);
  readCredential(s.credential);
  t.match(r.stdout, /no systemd here: start the link yourself, e\.g\. agent-connectors link --credential \S+\n/);
  t.same(s.systemctlCalls(), [], 'systemctl not called');
});

t.test('5xx, a lost answer and a 429 are retried with the same requestId; one credential is minted', async (t) => {
  const s = await setup(t);
  s.gw.inject({ kind: 'status5xx', status: 503 }, { endpoint: 'enroll' });
  s.gw.inject({ kind: 'dropAfterCommit' }, { endpoint: 'enroll' });
  s.gw.inject({ kind: 'status429', retryAfterS: 1 }, { endpoint: 'enroll' });
  const r = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: s.code(), env: s.env });
  t.equal(r.code, 0, r.stderr);
  const enrolls = s.gw.requestsTo('enroll');
  t.equal(enrolls.length, 4, 'three faults, then the answer');
  t.equal(new Set(enrolls.map((e) => e.requestId)).size, 1, 'one requestId throughout');
  t.equal(s.gw.control.stats().enrolled, 1, 'one credential minted');
  t.equal(s.gw.control.stats().enrollReplays, 1, 'the retry after the lost answer was a replay');
  t.ok(enrolls[3] && enrolls[2] && enrolls[3].at - enrolls[2].at >= 1_000, 'Retry-After honoured');
  t.ok(s.gw.control.hostOf(readCredential(s.credential)), 'the replayed credential is stored');
  t.match(r.stdout, /HTTP 503; retrying in/);
});

t.test('a refused code: exit 1, says to get a new one, nothing stored', async (t) => {
  const s = await setup(t);
  const used = s.code();
  s.gw.control.enroll({ requestId: '55555555-5555-4555-8555-555555555555', code: used, host: { hostname: 'other', version: '0' } });
  const r = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: used, env: s.env });
  t.equal(r.code, 1);
  t.match(r.stderr, /did not accept the pairing code .* get a new code/);
  t.equal(s.gw.requestsTo('enroll').length, 1, 'not retried');
  t.notOk(existsSync(s.credential));
  t.notOk(existsSync(s.linkEnv));
  t.notOk(existsSync(`${s.credential}.enroll-pending`));
});

t.test('network refused: exit 1 naming the URL; the pending requestId is reused by the next run', async (t) => {
  const s = await setup(t);
  const probe = createServer();
  probe.listen(0, '127.0.0.1');
  await once(probe, 'listening');
  const port = (probe.address() as { port: number }).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const deadUrl = `http://127.0.0.1:${port}`;
  const code = s.code();
  const r = await cli(['enroll', '--gateway', deadUrl, '--credential', s.credential, '--attempts', '2'], { stdin: code, env: s.env });
  t.equal(r.code, 1);
  t.match(r.stderr, new RegExp(`could not enrol at ${deadUrl}: connection refused \\(ECONNREFUSED\\) after 2 attempts`));
  t.match(r.stderr, /run enroll again with the same pairing code/);
  const pending = JSON.parse(readFileSync(`${s.credential}.enroll-pending`, 'utf8')) as { requestId: string };
  t.equal(statSync(`${s.credential}.enroll-pending`).mode & 0o777, 0o600);
  t.notMatch(readFileSync(`${s.credential}.enroll-pending`, 'utf8'), code, 'the code itself is not kept');

  const again = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: code, env: s.env });
  t.equal(again.code, 0, again.stderr);
  t.equal(s.gw.requestsTo('enroll')[0]?.requestId, pending.requestId, 'the second run asked with the pending requestId');
  readCredential(s.credential);
});

t.test('an enrolled host needs --force; --force replaces the credential', async (t) => {
  const s = await setup(t);
  t.equal((await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: s.code(), env: s.env })).code, 0);
  const first = readCredential(s.credential);
  const before = s.gw.requests.length;
  const refused = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: s.code(), env: s.env });
  t.equal(refused.code, 2);
  t.match(refused.stderr, /already enrolled .* add --force; to leave the Gateway, run agent-connectors unenroll/);
  t.equal(s.gw.requests.length, before, 'the Gateway was not asked; the code is not spent');
  const forced = await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential, '--force'], { stdin: s.code(), env: s.env });
  t.equal(forced.code, 0, forced.stderr);
  t.not(readCredential(s.credential), first, 'a new credential');
});

t.test('usage errors exit 2 before any request', async (t) => {
  const s = await setup(t);
  const cases: Array<[string, string[], string, RegExp]> = [
    ['no code on stdin', ['--gateway', s.gw.url], '', /no pairing code on stdin/],
    ['a code with spaces', ['--gateway', s.gw.url], 'not a code\n', /visible ASCII without spaces/],
    ['http to a public host', ['--gateway', 'http://gw.example.com'], s.code(), /--gateway: upstreamUrl may use http: only for a loopback host/],
    ['no --gateway', [], s.code(), /required option '--gateway <url>' not specified/],
    ['a query in the URL', ['--gateway', `${s.gw.url}/?x=1`], s.code(), /without a query or fragment/],
  ];
  for (const [name, args, stdin, why] of cases) {
    const r = await cli(['enroll', ...args, '--credential', s.credential], { stdin, env: s.env });
    t.equal(r.code, 2, name);
    t.match(r.stderr, why, name);
  }
  t.equal(s.gw.requests.length, 0, 'nothing was sent');
  t.notOk(existsSync(s.credential));
});

t.test('unenroll stops the link and removes the credential; a second run has nothing to do', async (t) => {
  const s = await setup(t);
  t.equal((await cli(['enroll', '--gateway', s.gw.url, '--credential', s.credential], { stdin: s.code(), env: s.env })).code, 0);
  readCredential(s.credential);
  const r = await cli(['unenroll', '--credential', s.credential], { env: s.env });
  t.equal(r.code, 0, r.stderr);
  t.notOk(existsSync(s.credential));
  t.notOk(existsSync(s.linkEnv));
  t.ok(s.systemctlCalls().includes('stop agent-connectors-link.service'));
  t.match(r.stdout, /serves no binding or provider until it is enrolled again/);
  const again = await cli(['unenroll', '--credential', s.credential], { env: s.env });
  t.equal(again.code, 0);
  t.match(again.stdout, /not enrolled/);
});

t.test('no pairing code or credential in any argv or any line of output', async (t) => {
  t.ok(secrets.size >= 8, 'codes and credentials to look for');
  t.ok(runs.length >= 10, 'runs to search');
  const all = runs.map((r) => [...r.argv, r.stdout, r.stderr].join('\n')).join('\n');
  t.same([...secrets].filter((s) => all.includes(s)), []);
});
