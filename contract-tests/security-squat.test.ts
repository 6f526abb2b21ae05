import type { ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { ensureAgentUser, spawnAsAgent, type AgentUser } from '../test/support/agent-user.js';
import { checkNoLeaks, knownSecrets, startCli, waitForLogAfter, writeToken, type CliProc, type LogLine } from '../test/support/cli-proc.js';
import { MockGateway } from '../test/support/mock-gateway.js';
import { binding, loadConfig, partDir, startProxy, type ProxyProc } from '../test/support/proxy-rig.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { Wakeups } from '../test/support/wakeups.js';

/*
 * Issue 21, items 3 and 6. A local user (here a real agent UID) binds the free port of a
 * stopped plain-http loopback upstream, or of a loopback-http Gateway, and waits: the
 * forwarder would hand it a binding's token, the cli-proxy a provider token, the link the
 * host credential. And an upstream aimed at the forwarder's own port turned one request
 * into thousands of sockets. What the squatter receives is recorded byte for byte.
 */

const TOKENS = {
  forwarder: 'tok-squat-FWD-7hQ2mX9pL4',
  cliProxy: 'tok-squat-CLI-3kR8nV1wZ6',
  credential: 'hostcred-squat-LNK-5tY0bC2dE8',
  loop: 'tok-squat-LOOP-9uI4oP6aS1',
} as const;
for (const s of Object.values(TOKENS)) knownSecrets.add(s);

/**
 * The squatter, run as the agent: listens on PORT, accepts every connection, prints what
 * each one carried (hex) and when it closed. On the first bytes it answers a bare 200 and
 * closes, so a victim that did send is not left waiting for headers.
 */
const SQUATTER = String.raw`
import socket, sys, threading
port = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', port))
s.listen(64)
lock = threading.Lock()
def say(line):
    with lock:
        sys.stdout.write(line + '\n'); sys.stdout.flush()
say('listening %d' % port)
def serve(c, n):
    total = 0
    answered = False
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            total += len(b)
            say('data %d %s' % (n, b.hex()))
            if not answered:
                answered = True
                c.sendall(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}')
    except OSError:
        pass
    say('closed %d %d' % (n, total))
    c.close()
n = 0
while True:
    c, _ = s.accept()
    n += 1
    say('accepted %d' % n)
    threading.Thread(target=serve, args=(c, n), daemon=True).start()
`;

class Squatter {
  readonly lines: string[] = [];
  private readonly arrivals = new Wakeups();

  constructor(readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.lines.push(line);
      this.arrivals.wake();
    });
  }

  static async start(t: TapTest, user: AgentUser, port: number): Promise<Squatter> {
    const child = spawnAsAgent(user, 'exec python3 -c "$1" "$2"', { env: { PATH: '/usr/bin:/bin' }, args: [SQUATTER, String(port)] });
    const sq = new Squatter(child);
    t.teardown(() => {
      child.kill('SIGKILL');
    });
    await sq.waitFor((l) => l === `listening ${port}`, 'the squatter listening');
    return sq;
  }

  waitFor(pred: (line: string) => boolean, what: string, timeoutMs = 15_000): Promise<string> {
    return this.arrivals.until(
      () => this.lines.find(pred),
      timeoutMs,
      () => `${what}: timed out; squatter printed:\n${this.lines.slice(-10).join('\n')}`,
    );
  }

  /** Every byte received, over all connections. */
  received(): Buffer {
    return Buffer.concat(this.lines.filter((l) => l.startsWith('data ')).map((l) => Buffer.from(l.split(' ')[2] ?? '', 'hex')));
  }

  get accepted(): number {
    return this.lines.filter((l) => l.startsWith('accepted ')).length;
  }

  /** Waits until every connection accepted so far has closed (the victim is done with it). */
  async settled(): Promise<void> {
    const n = this.accepted;
    for (let i = 1; i <= n; i++) await this.waitFor((l) => l.startsWith(`closed ${i} `), `connection ${i} closed`);
  }
}

/** A loopback port that was an upstream's and is free now: the upstream has stopped. */
async function stoppedUpstreamPort(): Promise<{ port: number; url: (path: string) => string }> {
  const gw = await MockGateway.start();
  const port = gw.port;
  await gw.close();
  return { port, url: (path) => `http://127.0.0.1:${port}${path}` };
}

async function call(url: string, init: { method?: string; headers?: Record<string, string>; body?: string } = {}): Promise<{ status: number; body: string }> {
  const res = await request(url, { method: (init.method ?? 'GET') as 'GET', headers: init.headers, body: init.body, headersTimeout: 30_000, bodyTimeout: 30_000 });
  return { status: res.statusCode, body: await res.body.text() };
}

function errorCode(body: string): string | undefined {
  try {
    return (JSON.parse(body) as { error?: string }).error;
  } catch {
    return undefined;
  }
}

function assertNothingSent(t: TapTest, sq: Squatter, secret: string, what: string): void {
  const got = sq.received();
  t.notOk(got.includes(secret), `${what}: the squatter never received the secret`);
  t.equal(got.length, 0, `${what}: the squatter received no byte at all (${got.length} bytes: ${JSON.stringify(got.toString('latin1').slice(0, 80))})`);
}

const MCP_INIT = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} });
const MCP_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };

const agent = ensureAgentUser();

/**
 * A forwarder with one binding to a stopped loopback upstream whose port the agent now
 * holds; one agent request through it must be refused with nothing sent. Returns the log
 * index before the request.
 */
async function squattedForwarder(t: TapTest, id: string, args: (stateDir: string) => string[]): Promise<{ fwd: ProxyProc; mark: number }> {
  const up = await stoppedUpstreamPort();
  const stateDir = tempDir('ac-squat-fwd-');
  const dir = partDir(stateDir, 'forwarder');
  writeToken(join(dir, `inst-${id}.token`), TOKENS.forwarder);
  const extra = args(stateDir);
  const fwd = await startProxy(t, 'forwarder', { stateDir, args: extra, config: { [id]: binding(dir, `inst-${id}`, up.url('/mcp')) } });
  await fwd.waitForLog((l) => l.msg === 'registry loaded' && l.instances === 1);
  const sq = await Squatter.start(t, agent, up.port);
  const mark = fwd.logs.length;
  const res = await call(`${fwd.base}/i/${id}/mcp`, { method: 'POST', headers: MCP_HEADERS, body: MCP_INIT });
  t.equal(res.status, 502, 'the agent is answered 502');
  t.equal(errorCode(res.body), 'upstream_untrusted', 'with the upstream_untrusted code');
  await sq.settled();
  assertNothingSent(t, sq, TOKENS.forwarder, `forwarder ${extra.join(' ')}`);
  return { fwd, mark };
}

t.test('forwarder: an agent squatting the port of a stopped loopback upstream gets no token', async (t) => {
  const { fwd, mark } = await squattedForwarder(t, 'squatfwd1', () => []);
  const line = await waitForLogAfter(fwd, mark, (l) => typeof l.msg === 'string' && l.msg.startsWith('upstream listener not trusted'));
  t.equal(line.uid, agent.uid, 'the log names the squatter UID');
});

t.test('forwarder: listing the agent with --loopback-owner-uids does not make it trusted', async (t) => {
  await squattedForwarder(t, 'squatfwd2', (stateDir) => {
    const agentUsers = join(stateDir, 'agent-users');
    writeFileSync(agentUsers, `${agent.name}\n`);
    return ['--agent-users-file', agentUsers, '--loopback-owner-uids', String(agent.uid)];
  });
});

t.test('cli-proxy: an agent squatting the port of a stopped loopback provider gets no token', async (t) => {
  const up = await stoppedUpstreamPort();
  const stateDir = tempDir('ac-squat-cli-');
  const dir = partDir(stateDir, 'cli-proxy');
  writeToken(join(dir, 'sq.token'), TOKENS.cliProxy);
  const catalog = { sq: { upstream: up.url('/v1'), tokenFile: join(dir, 'sq.token'), inject: { type: 'header', name: 'X-Api-Key', value: 'Key {token}' } } };
  const proxy: ProxyProc = await startProxy(t, 'cli-proxy', { stateDir, config: catalog });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  const sq = await Squatter.start(t, agent, up.port);

  const res = await call(`${proxy.base}/p/sq/search?q=x`);
  t.equal(res.status, 502, 'the CLI is answered 502');
  t.equal(errorCode(res.body), 'upstream_untrusted');
  await sq.settled();
  assertNothingSent(t, sq, TOKENS.cliProxy, 'cli-proxy');
});

t.test('link: an agent squatting the port of a loopback-http Gateway gets no host credential', async (t) => {
  const up = await stoppedUpstreamPort();
  const root = tempDir('ac-squat-link-');
  const credential = join(root, 'host-credential');
  writeFileSync(credential, `${TOKENS.credential}\n`, { mode: 0o600 });
  const sq = await Squatter.start(t, agent, up.port);
  const link: CliProc = startCli(
    ['link', '--credential', credential, '--gateway', up.url(''), '--host-id', 'host-squat', '--state-dir', join(root, 'state'), '--no-audit', '--log-level', 'trace'],
    { AGENT_CONNECTORS_TEST_HOOKS: 'systemd:absent' },
  );
  t.teardown(() => link.stop('SIGKILL'));
  // Every part of the link (state poll, presence) is refused; the first refusal is enough.
  const refused = await link.waitForLog((l: LogLine) => typeof l.msg === 'string' && l.msg.startsWith('gateway listener not trusted'), 20_000);
  t.equal(refused.uid, agent.uid, 'the log names the squatter UID');
  await sq.settled();
  assertNothingSent(t, sq, TOKENS.credential, 'link');
});

t.test('forwarder: an upstream at the forwarder\'s own port is refused, no socket to itself', async (t) => {
  const stateDir = tempDir('ac-squat-loop-');
  const dir = partDir(stateDir, 'forwarder');
  writeToken(join(dir, 'inst-loop.token'), TOKENS.loop);
  const fwd = await startProxy(t, 'forwarder', { stateDir });
  // Its port is the kernel's pick: known only once it listens, as a Gateway would learn it.
  await loadConfig(fwd, { squatloop1: binding(dir, 'inst-loop', `http://127.0.0.1:${fwd.port}/i/squatloop1/mcp`) });

  const before = fwd.logs.length;
  const res = await call(`${fwd.base}/i/squatloop1/mcp`, { method: 'POST', headers: MCP_HEADERS, body: MCP_INIT });
  t.equal(res.status, 502, 'the agent is answered 502');
  t.equal(errorCode(res.body), 'upstream_loop', 'with the upstream_loop code');
  // The agent's own request is logged last, once its answer went out: any looped call is in by then.
  await waitForLogAfter(fwd, before, (l) => l.msg === 'access' && l.status === 502);
  const access = fwd.logs.slice(before).filter((l) => l.msg === 'access');
  t.equal(access.length, 1, 'the forwarder served one request: its own upstream call never reached it');
});

checkNoLeaks(t);
