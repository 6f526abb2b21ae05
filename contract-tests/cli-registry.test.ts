import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { CLI } from '../test/support/cli-proc.js';
import { tempDir } from '../test/support/temp-dir.js';

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs the built CLI to completion with only PATH and `env` set (so no STATE_DIRECTORY or
 * NOTIFY_SOCKET unless the test sets it). `env -i` first: tap's spawn hooks would add its
 * processinfo loader, which doubles the start of every one of the ~60 CLI runs here and
 * took this file past its timeout on a busy machine.
 */
function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  const pairs = Object.entries({ PATH: process.env.PATH, ...env })
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${v}`);
  return new Promise((resolve, reject) => {
    const child = spawn('/usr/bin/env', ['-i', ...pairs, process.execPath, CLI, ...args], { env: {}, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => err.push(c));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') }));
  });
}

function stateDir(): string {
  return tempDir('ac-cli-', t);
}

const instancesOf = (state: string): string => join(state, 'mcp-forwarder', 'instances.json');
const UPSTREAM = 'https://gateway.example.com/mcp';
const BINDING_ID = /^[A-Za-z0-9_-]{8,128}$/;

function readJson(path: string): Record<string, { instanceId: string; upstreamUrl: string; tokenFile: string }> {
  return JSON.parse(readFileSync(path, 'utf8')) as Record<string, { instanceId: string; upstreamUrl: string; tokenFile: string }>;
}

t.test('bind creates instances.json 0600 with a generated id and the default token file', async (t) => {
  const state = stateDir();
  const r = await run(['bind', '--instance-id', 'inst-a', '--upstream', UPSTREAM, '--state-dir', state]);
  t.equal(r.code, 0, r.stderr);
  const id = r.stdout.trim();
  t.match(id, BINDING_ID, 'prints a generated binding id');
  t.equal(r.stdout, `${id}\n`, 'prints only the id');
  const file = instancesOf(state);
  t.ok(statSync(join(state, 'mcp-forwarder')).isDirectory(), 'creates the directory');
  t.equal(statSync(file).mode & 0o777, 0o600, 'instances.json is 0600');
  t.equal(statSync(join(state, 'mcp-forwarder')).mode & 0o077, 0, 'the directory is not open to group/others');
  t.strictSame(readJson(file), {
    [id]: { instanceId: 'inst-a', upstreamUrl: UPSTREAM, tokenFile: join(state, 'mcp-forwarder', 'inst-a.token') },
  });

  const again = await run(['bind', '--instance-id', 'inst-a', '--upstream', UPSTREAM, '--state-dir', state]);
  t.equal(again.code, 0, again.stderr);
  t.not(again.stdout.trim(), id, 'each generated id is fresh');
  t.equal(Object.keys(readJson(file)).length, 2);
  t.strictSame(readdirSync(join(state, 'mcp-forwarder')), ['instances.json'], 'no lock or temp files left behind');
});

t.test('bind with a given id, list, unbind', async (t) => {
  const state = stateDir();
  const id = 'my-binding_0001';
  const tokenFile = join(state, 'custom', 'x.token');
  const b = await run(['bind', id, '--instance-id', 'inst-b', '--upstream', 'http://127.0.0.1:9/mcp', '--token-file', tokenFile, '--state-dir', state]);
  t.equal(b.code, 0, b.stderr);
  t.equal(b.stdout.trim(), id);
  t.strictSame(readJson(instancesOf(state))[id], { instanceId: 'inst-b', upstreamUrl: 'http://127.0.0.1:9/mcp', tokenFile });

  const l = await run(['list', '--state-dir', state]);
  t.equal(l.code, 0, l.stderr);
  t.match(l.stdout, id);
  t.match(l.stdout, 'inst-b');
  t.match(l.stdout, 'http://127.0.0.1:9/mcp');

  const lj = await run(['list', '--json', '--state-dir', state]);
  t.equal(lj.code, 0, lj.stderr);
  t.strictSame(JSON.parse(lj.stdout), readJson(instancesOf(state)));

  const u = await run(['unbind', id, '--state-dir', state]);
  t.equal(u.code, 0, u.stderr);
  t.strictSame(readJson(instancesOf(state)), {});
  t.equal(statSync(instancesOf(state)).mode & 0o777, 0o600);

  const l2 = await run(['list', '--state-dir', state]);
  t.equal(l2.code, 0, l2.stderr);
  t.notMatch(l2.stdout, id);
});

t.test('unbind of an unknown id exits 2 and changes nothing', async (t) => {
  const state = stateDir();
  const b = await run(['bind', 'known_binding_1', '--instance-id', 'i1', '--upstream', UPSTREAM, '--state-dir', state]);
  t.equal(b.code, 0, b.stderr);
  const before = readFileSync(instancesOf(state), 'utf8');
  const u = await run(['unbind', 'unknown_binding_9', '--state-dir', state]);
  t.equal(u.code, 2, u.stderr);
  t.ok(u.stderr.length > 0, 'says why on stderr');
  t.equal(readFileSync(instancesOf(state), 'utf8'), before);
});

t.test('list with no registry yet prints nothing and exits 0', async (t) => {
  const state = stateDir();
  const l = await run(['list', '--state-dir', state]);
  t.equal(l.code, 0, l.stderr);
  t.equal(l.stdout, '');
});

t.test('invalid upstream or id → exit 2, file untouched', async (t) => {
  const state = stateDir();
  const ok = await run(['bind', 'existing_binding', '--instance-id', 'i1', '--upstream', UPSTREAM, '--state-dir', state]);
  t.equal(ok.code, 0, ok.stderr);
  const file = instancesOf(state);
  const before = readFileSync(file, 'utf8');
  const ino = statSync(file).ino;
  const cases: string[][] = [
    ['--upstream', 'http://gateway.example.com/mcp'],
    ['--upstream', 'ftp://gateway.example.com/mcp'],
    ['--upstream', 'https://user:pass@gateway.example.com/mcp'],
    ['--upstream', 'not a url'],
    ['--upstream', 'http://127.0.0.1.evil.example/mcp'],
  ];
  for (const extra of cases) {
    const r = await run(['bind', 'new_binding_01', '--instance-id', 'i2', ...extra, '--state-dir', state]);
    t.equal(r.code, 2, `${extra.join(' ')} → exit 2: ${r.stderr}`);
    t.ok(r.stderr.trim().length > 0, 'a message on stderr');
  }
  for (const badId of ['short', 'has.dot.in.it', 'x'.repeat(129)]) {
    const r = await run(['bind', badId, '--instance-id', 'i2', '--upstream', UPSTREAM, '--state-dir', state]);
    t.equal(r.code, 2, `id ${badId.slice(0, 20)} → exit 2: ${r.stderr}`);
  }
  const noInstance = await run(['bind', 'new_binding_01', '--upstream', UPSTREAM, '--state-dir', state]);
  t.equal(noInstance.code, 2, `missing --instance-id → exit 2: ${noInstance.stderr}`);
  t.equal(readFileSync(file, 'utf8'), before, 'content unchanged');
  t.equal(statSync(file).ino, ino, 'file not even rewritten');
});

t.test('invalid upstream on a fresh state dir creates no registry', async (t) => {
  const state = stateDir();
  const r = await run(['bind', '--instance-id', 'i1', '--upstream', 'http://gateway.example.com/', '--state-dir', state]);
  t.equal(r.code, 2, r.stderr);
  t.notOk(existsSync(instancesOf(state)));
});

t.test('20 concurrent binds all survive', async (t) => {
  const state = stateDir();
  const ids = Array.from({ length: 20 }, (_, i) => `concurrent_${String(i).padStart(2, '0')}`);
  const results = await Promise.all(
    ids.map((id, i) => run(['bind', id, '--instance-id', `inst-${i}`, '--upstream', UPSTREAM, '--state-dir', state])),
  );
  results.forEach((r, i) => t.equal(r.code, 0, `bind ${i}: ${r.stderr}`));
  const text = readFileSync(instancesOf(state), 'utf8');
  let parsed: Record<string, { instanceId: string }> = {};
  t.doesNotThrow(() => {
    parsed = JSON.parse(text) as Record<string, { instanceId: string }>;
  }, 'valid JSON');
  t.strictSame(Object.keys(parsed).sort(), [...ids].sort(), 'all 20 entries');
  ids.forEach((id, i) => t.equal(parsed[id]?.instanceId, `inst-${i}`));
  t.equal(statSync(instancesOf(state)).mode & 0o777, 0o600);
  t.strictSame(readdirSync(join(state, 'mcp-forwarder')), ['instances.json'], 'no lock or temp files left behind');
});

t.test('bind refuses to overwrite an invalid hand-edited instances.json', async (t) => {
  const state = stateDir();
  mkdirSync(join(state, 'mcp-forwarder'), { recursive: true });
  const file = instancesOf(state);
  for (const text of [
    '{\n  "hand_edited_01": {"instanceId": "i1", "upstreamUrl": "https://gw/mcp", "tokenFile": "/x",}\n}\n',
    JSON.stringify({ hand_edited_01: { instanceId: 'i1', upstreamUrl: 'http://gateway.example.com/mcp', tokenFile: '/x' } }),
    JSON.stringify({ short: { instanceId: 'i1', upstreamUrl: 'https://gw/mcp', tokenFile: '/x' } }),
  ]) {
    writeFileSync(file, text, { mode: 0o600 });
    const r = await run(['bind', 'new_binding_01', '--instance-id', 'i2', '--upstream', UPSTREAM, '--state-dir', state]);
    t.equal(r.code, 2, `exit 2: ${r.stderr}`);
    t.ok(r.stderr.trim().length > 0, 'says why');
    t.equal(readFileSync(file, 'utf8'), text, 'file unchanged');
    const u = await run(['unbind', 'hand_edited_01', '--state-dir', state]);
    t.equal(u.code, 2, `unbind refuses too: ${u.stderr}`);
    t.equal(readFileSync(file, 'utf8'), text, 'file unchanged');
  }
});

t.test('mcp-add prints the agent\'s official command', async (t) => {
  const id = 'mcp_add_binding_01';
  const expected: Record<string, string> = {
    claude: `claude mcp add --transport http connectors http://127.0.0.1:14323/i/${id}/mcp`,
    codex: `codex mcp add connectors --url http://127.0.0.1:14323/i/${id}/mcp`,
    openclaw: `openclaw mcp add connectors --url http://127.0.0.1:14323/i/${id}/mcp --transport streamable-http`,
  };
  for (const [agent, line] of Object.entries(expected)) {
    const r = await run(['mcp-add', id, '--agent', agent]);
    t.equal(r.code, 0, r.stderr);
    t.equal(r.stdout, `${line}\n`, agent);
  }
  const plain = await run(['mcp-add', id, '--url-base', 'http://127.0.0.1:15000/']);
  t.equal(plain.code, 0, plain.stderr);
  t.equal(plain.stdout, `http://127.0.0.1:15000/i/${id}/mcp\n`, 'without --agent: the plain URL, for any Streamable HTTP client');
});

t.test('mcp-add refuses a bad agent and a bad id with exit 2', async (t) => {
  for (const args of [
    ['mcp-add', 'mcp_add_binding_01', '--agent', 'cursor'],
    ['mcp-add', 'mcp_add_binding_01', '--agent', ''],
    ['mcp-add', 'bad id!', '--agent', 'claude'],
    ['mcp-add', 'short', '--agent', 'claude'],
    ['mcp-add', '--agent', 'claude'],
  ]) {
    const r = await run(args);
    t.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    t.equal(r.stdout, '', 'nothing on stdout');
    t.ok(r.stderr.trim().length > 0, 'a message on stderr');
  }
});

t.test('STATE_DIRECTORY is honoured when --state-dir is absent', async (t) => {
  const state = stateDir();
  const env = { STATE_DIRECTORY: state };
  const r = await run(['bind', 'state_env_bind_1', '--instance-id', 'inst-env', '--upstream', UPSTREAM], env);
  t.equal(r.code, 0, r.stderr);
  t.strictSame(readJson(instancesOf(state)), {
    state_env_bind_1: { instanceId: 'inst-env', upstreamUrl: UPSTREAM, tokenFile: join(state, 'mcp-forwarder', 'inst-env.token') },
  });
  const l = await run(['list'], env);
  t.equal(l.code, 0, l.stderr);
  t.match(l.stdout, 'state_env_bind_1');
  const u = await run(['unbind', 'state_env_bind_1'], env);
  t.equal(u.code, 0, u.stderr);
  t.strictSame(readJson(instancesOf(state)), {});
});

t.test('--state-dir wins over STATE_DIRECTORY', async (t) => {
  const fromEnv = stateDir();
  const fromFlag = stateDir();
  const r = await run(['bind', 'flag_wins_bind_1', '--instance-id', 'i1', '--upstream', UPSTREAM, '--state-dir', fromFlag], {
    STATE_DIRECTORY: fromEnv,
  });
  t.equal(r.code, 0, r.stderr);
  t.ok(existsSync(instancesOf(fromFlag)));
  t.notOk(existsSync(instancesOf(fromEnv)));
  t.equal(readJson(instancesOf(fromFlag)).flag_wins_bind_1?.tokenFile, join(fromFlag, 'mcp-forwarder', 'i1.token'));
});
