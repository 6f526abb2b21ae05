import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { execFileSync } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { knownSecrets, checkNoLeaks, startCli } from '../test/support/cli-proc.js';
import { tempDir } from '../test/support/temp-dir.js';

t.test('dev: a real MCP client lists and calls the demo tools through the forwarder', async (t) => {
  const stateDir = tempDir('ac-dev-');
  const dev = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0']);
  t.teardown(() => dev.stop('SIGKILL'));
  const url = (await dev.waitForStderr(/MCP URL:\s+(\S+)/, 15_000))[1] as string;
  t.match(url, /^http:\/\/127\.0\.0\.1:\d+\/i\/demo_[A-Za-z0-9_-]+\/mcp$/);

  // The first token comes from renew fetch + apply against the demo Gateway.
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo');
  const tokenFile = join(stateDir, 'mcp-forwarder', 'demo.token');
  t.equal(statSync(tokenFile).mode & 0o777, 0o600, 'demo token file is 0600');
  knownSecrets.add(readFileSync(tokenFile, 'utf8').trim());

  for (const agent of ['claude mcp add --transport http connectors', 'codex mcp add connectors --url', 'openclaw mcp add connectors --url']) {
    t.ok(dev.stderr.some((l) => l.includes(agent) && l.includes(url)), `prints: ${agent}`);
  }

  const client = new Client({ name: 'dev-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const tools = (await client.listTools()).tools.map((x) => x.name).sort();
  t.same(tools, ['add', 'count', 'echo', 'whoami']);
  const sum = await client.callTool({ name: 'add', arguments: { a: 2, b: 40 } });
  t.same(sum.content, [{ type: 'text', text: '42' }]);
  const progress: number[] = [];
  const counted = await client.callTool({ name: 'count', arguments: { n: 3, delayMs: 10 } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
  });
  t.same(counted.content, [{ type: 'text', text: 'counted to 3' }]);
  t.same(progress, [1, 2, 3], 'progress streamed over SSE through the forwarder');
  await transport.terminateSession();
  await client.close();

  // Access lines are written in batches (every 20 ms): wait for the session's last one,
  // the DELETE; the lines before it are in the log by then.
  await dev.waitForLog((l) => l.msg === 'access' && l.method === 'DELETE');
  const access = dev.logs.filter((l) => l.msg === 'access' && l.mcpMethod === 'tools/call');
  t.equal(access.length, 2, 'one access line per tools/call');

  // The shell CLI line printed by dev works as printed: shim → cli-proxy → demo API.
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'cli:demo');
  knownSecrets.add(readFileSync(join(stateDir, 'cli-proxy', 'demo.token'), 'utf8').trim());
  const line = dev.stderr.find((l) => l.includes('acdemo whoami'))?.trim() ?? '';
  t.match(line, /^PATH=\S+:\S+:\$PATH acdemo whoami$/, 'prints a runnable shim command');
  const out = execFileSync('sh', ['-c', line], { encoding: 'utf8' });
  t.match(out, /"provider":"demo","tokenId":"tid_/, 'the demo API answered the shimmed CLI');
  t.notMatch(out, readFileSync(join(stateDir, 'cli-proxy', 'demo.token'), 'utf8').trim(), 'no token in the CLI output');
  // The call is audited: the link part uploads its event and the demo Gateway logs it.
  const audited = await dev.waitForLog((l) => l.msg === 'audit event received' && l.provider === 'demo', 15_000);
  t.match(audited, { method: 'GET', status: 200, path: /^\/[^?]*$/ }, 'dev shows the event the demo Gateway received');

  // A second run reuses the same binding id, so a configured agent keeps working.
  await dev.stop('SIGTERM');
  const again = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0']);
  t.teardown(() => again.stop('SIGKILL'));
  const url2 = (await again.waitForStderr(/MCP URL:\s+(\S+)/, 15_000))[1] as string;
  t.equal(url2.replace(/:\d+\//, ':P/'), url.replace(/:\d+\//, ':P/'), 'same binding id across runs');
  await again.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo');
  knownSecrets.add(readFileSync(tokenFile, 'utf8').trim());
});

t.test('dev: renewal rotates the token under a live MCP session', async (t) => {
  const stateDir = tempDir('ac-dev-rot-');
  const dev = startCli(['dev', '--state-dir', stateDir, '--listen', '127.0.0.1:0', '--cli-listen', '127.0.0.1:0', '--token-lifetime-s', '3']);
  t.teardown(() => dev.stop('SIGKILL'));
  const url = (await dev.waitForStderr(/MCP URL:\s+(\S+)/, 15_000))[1] as string;
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo');
  const tokenFile = join(stateDir, 'mcp-forwarder', 'demo.token');
  const client = new Client({ name: 'dev-rotation', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const session = transport.sessionId;
  const seen = new Set<string>();
  // Each round waits for a renewal applied after it read the token; at worst every other
  // round sees the token of the round before, so six rounds see three tokens.
  for (let round = 0; round < 6 && seen.size < 3; round++) {
    const mark = dev.logs.length;
    knownSecrets.add(readFileSync(tokenFile, 'utf8').trim());
    const r = await client.callTool({ name: 'whoami', arguments: {} });
    const text = (r.content as Array<{ type: string; text: string }>)[0]?.text ?? '{}';
    seen.add((JSON.parse(text) as { tokenId: string }).tokenId);
    t.equal(transport.sessionId, session, 'same MCP session');
    if (seen.size < 3) await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'instance:demo', 20_000, mark);
  }
  t.ok(seen.size >= 3, `the Gateway saw ${seen.size} distinct token ids in one session`);
  t.ok(dev.logs.filter((l) => l.msg === 'renewed; handed to apply').length >= 3, 'fetch logged the renewals');
  await client.close();
});

checkNoLeaks(t);
