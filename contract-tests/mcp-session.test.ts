import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Progress } from '@modelcontextprotocol/sdk/types.js';
import t from 'tap';
import { checkNoLeaks, writeToken } from '../test/support/cli-proc.js';
import { until } from '../test/support/poll.js';
import { binding, startRig } from '../test/support/proxy-rig.js';
import { McpUpstream } from './helpers/mcp-upstream.js';

const BINDING = 'bind_mcp_session_01';

/** The text of the first content item of a tool result. */
function firstText(result: Awaited<ReturnType<Client['callTool']>>): string | undefined {
  const content = result.content as Array<{ type: string; text?: string }> | undefined;
  return content?.[0]?.text;
}

t.test('13. an SDK client keeps one MCP session through the forwarder across token renewals', async (t) => {
  const tokens = ['tok-mcp-gen0-7a1b2c', 'tok-mcp-gen1-8d3e4f', 'tok-mcp-gen2-9a5b6c', 'tok-mcp-gen3-0d7e8f'];
  let accepted = tokens[0] as string;
  const { upstream, proc: fwd, tokenFile: tokenPath } = await startRig(t, 'forwarder', {
    upstream: () => McpUpstream.start({ check: (token) => token === accepted }),
    tokens: { 'inst-mcp.token': tokens[0] as string },
    config: (up, dir) => ({ [BINDING]: binding(dir, 'inst-mcp', up.url()) }),
  });
  const tokenFile = tokenPath('inst-mcp.token');

  const client = new Client({ name: 'contract-test-agent', version: '0.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(`${fwd.base}/i/${BINDING}/mcp`));
  t.teardown(() => client.close());
  await client.connect(transport);
  const sessionId = transport.sessionId;
  t.ok(sessionId, 'the upstream issued a session id that reached the client');
  t.ok(upstream.sessions.has(sessionId ?? ''), 'the session lives at the upstream');

  const listed = await client.listTools();
  t.same(listed.tools.map((tool) => tool.name).sort(), ['echo', 'progress']);

  /** The newest tools/call POST the upstream saw. */
  const lastCall = () => upstream.seen.filter((s) => s.method === 'POST' && s.rpcMethod === 'tools/call').at(-1);

  for (const [gen, token] of tokens.entries()) {
    if (gen > 0) {
      // Renewal: the token file and the upstream's accepted token rotate together.
      writeToken(tokenFile, token);
      accepted = token;
    }
    const echoed = await client.callTool({ name: 'echo', arguments: { text: `gen ${gen}` } });
    t.equal(firstText(echoed), `echo: gen ${gen}`, `generation ${gen}: echo call succeeded`);
    t.equal(lastCall()?.token, token, `generation ${gen}: the upstream saw the new token`);
    t.equal(lastCall()?.sessionId, sessionId, `generation ${gen}: same session id`);

    const progress: Progress[] = [];
    const done = await client.callTool({ name: 'progress', arguments: { steps: 3 } }, undefined, {
      onprogress: (p) => progress.push(p),
    });
    t.equal(firstText(done), 'done after 3 steps', `generation ${gen}: progress call succeeded`);
    t.same(
      progress.map((p) => [p.progress, p.total, p.message]),
      [
        [1, 3, 'step 1'],
        [2, 3, 'step 2'],
        [3, 3, 'step 3'],
      ],
      `generation ${gen}: every progress notification reached the client, in order (SSE response)`,
    );
    t.equal(lastCall()?.token, token);

    const again = await client.listTools();
    t.equal(again.tools.length, 2, `generation ${gen}: tools/list works`);
  }

  // Ending the session: DELETE with the session id, carrying the current token.
  await transport.terminateSession();
  await until(() => upstream.seen.some((s) => s.method === 'DELETE'), 'the DELETE to reach the upstream');
  const del = upstream.seen.find((s) => s.method === 'DELETE');
  t.equal(del?.sessionId, sessionId, 'DELETE carried the session id');
  t.equal(del?.token, tokens.at(-1), 'DELETE carried the newest token');
  await until(() => !upstream.sessions.has(sessionId ?? ''), 'the upstream to end the session');

  const [init, ...rest] = upstream.seen;
  t.equal(init?.rpcMethod, 'initialize', 'the first request was initialize');
  t.equal(init?.sessionId, undefined, 'initialize carries no session id');
  t.ok(rest.length >= 4 * tokens.length, 'the upstream saw every later request');
  t.same(
    rest.filter((s) => s.sessionId !== sessionId).map((s) => `${s.method} ${s.rpcMethod ?? ''}`),
    [],
    'every request after initialize carried the same mcp-session-id',
  );
  t.same(
    [...new Set(upstream.seen.map((s) => s.token))],
    tokens,
    'the upstream saw each token, in renewal order, and no other',
  );
  t.same(
    upstream.seen.filter((s) => s.status === 401).length,
    0,
    'no request was rejected by the upstream',
  );
  t.equal(upstream.seen.filter((s) => s.rpcMethod === 'initialize').length, 1, 'exactly one session was initialized');
  t.equal(upstream.sessions.size, 0, 'and it is gone');

  // The access line names each tool the SDK called, its JSON-RPC id and protocol version,
  // and never an argument value.
  await until(() => fwd.logs.filter((l) => l.msg === 'access' && l.mcpMethod === 'tools/call').length >= 2 * tokens.length, 'the tools/call access lines');
  const calls = fwd.logs.filter((l) => l.msg === 'access' && l.mcpMethod === 'tools/call');
  t.same([...new Set(calls.map((l) => l.tool))].sort(), ['echo', 'progress'], 'each tools/call line names its tool');
  t.ok(calls.every((l) => typeof l.rpcId === 'number'), 'and carries the JSON-RPC id');
  t.ok(calls.every((l) => typeof l.protocolVersion === 'string' && l.protocolVersion.length > 0), 'and the protocol version the SDK negotiated');
  t.notOk(calls.some((l) => JSON.stringify(l).includes('gen 0')), 'no argument value in any line');
});

checkNoLeaks(t);
