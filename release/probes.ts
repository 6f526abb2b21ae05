import { spawn } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { AgentBins } from './agents.js';
import { brief, runCapped, type CappedResult } from './capped.js';

/** What one probe found: the agent connected and listed `tools` tools, or why not. */
export interface Verdict {
  client: string;
  ok: boolean;
  tools: number;
  detail: string;
  /** The agent's own command the gate ran to configure it (what `mcp-add` printed), if any. */
  command?: string;
  /** The directory that stood in for the agent's home; its files are searched for secrets. */
  home?: string;
}

export interface ProbeContext {
  url: string;
  /** The MCP server's name in the agent (the `--name` of `mcp-add`). */
  name: string;
  bins: AgentBins;
  /** Scratch directory of this probe (home, config, TMPDIR). */
  work: string;
  /** `mcp-add --agent <agent>`'s output, for the agents that have one. */
  addCommand: (agent: 'claude' | 'codex' | 'openclaw') => Promise<string>;
  /** Tool the gate calls once listed, with its arguments. */
  call: { tool: string; args: Record<string, unknown> };
  timeoutMs: number;
}

const SYSTEM_PATH = '/usr/local/bin:/usr/bin:/bin';

/** The printed command split into words, its program replaced by the installed binary. */
function argvOf(command: string, program: string, binary: string): string[] {
  const words = command.trim().split(/\s+/);
  if (words[0] !== program) throw new Error(`mcp-add printed "${command}", which does not start with ${program}`);
  return [binary, ...words.slice(1)];
}

function fail(client: string, detail: string, extra: Partial<Verdict> = {}): Verdict {
  return { client, ok: false, tools: 0, detail, ...extra };
}

export function outcome(r: CappedResult): string {
  if (r.timedOut) return 'timed out';
  return r.code === null ? `killed by ${r.signal}` : `exit ${r.code}`;
}

function homeOf(ctx: ProbeContext, client: string): { home: string; tmp: string } {
  const home = join(ctx.work, client, 'home');
  const tmp = join(ctx.work, client, 'tmp');
  mkdirSync(home, { recursive: true });
  mkdirSync(tmp, { recursive: true });
  return { home, tmp };
}

/**
 * Claude Code: `claude mcp add …` exactly as printed, in a throw-away home and project;
 * then `claude mcp list` (its health check) and a headless `claude -p` whose first event
 * lists the MCP servers and tools it loaded. The model call that would follow goes to a
 * closed loopback port and is not retried, so no model or key is needed.
 */
export async function probeClaude(ctx: ProbeContext): Promise<Verdict> {
  const client = 'claude-code';
  const { home, tmp } = homeOf(ctx, client);
  const project = join(ctx.work, client, 'project');
  mkdirSync(project, { recursive: true });
  const command = await ctx.addCommand('claude');
  const env = {
    PATH: SYSTEM_PATH,
    HOME: home,
    TMPDIR: tmp,
    CLAUDE_CONFIG_DIR: join(home, '.claude'),
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_AUTOUPDATER: '1',
    DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1',
    MCP_TIMEOUT: String(ctx.timeoutMs - 5000),
  };
  const [bin, ...args] = argvOf(command, 'claude', ctx.bins.claude);
  const added = await runCapped(bin!, args, { env, cwd: project, timeoutMs: ctx.timeoutMs });
  if (added.code !== 0) return fail(client, `${command}: ${outcome(added)}: ${brief(added.output)}`, { command, home });
  const listed = await runCapped(ctx.bins.claude, ['mcp', 'list'], { env, cwd: project, timeoutMs: ctx.timeoutMs });
  const line = listed.output.split('\n').find((l) => l.startsWith(`${ctx.name}:`)) ?? '';
  if (!/Connected/.test(line)) return fail(client, `claude mcp list: ${brief(line || listed.output)}`, { command, home });
  const headless = await runCapped(ctx.bins.claude, ['-p', 'hi', '--output-format', 'stream-json', '--verbose'], {
    env: { ...env, ANTHROPIC_API_KEY: 'sk-ant-gate-placeholder', ANTHROPIC_BASE_URL: 'http://127.0.0.1:9', CLAUDE_CODE_MAX_RETRIES: '0' },
    cwd: project,
    timeoutMs: ctx.timeoutMs,
  });
  for (const text of headless.output.split('\n')) {
    let event: { type?: unknown; subtype?: unknown; mcp_servers?: { name: string; status: string }[]; tools?: string[] };
    try {
      event = JSON.parse(text) as typeof event;
    } catch {
      continue;
    }
    if (event.type !== 'system' || event.subtype !== 'init') continue;
    const server = (event.mcp_servers ?? []).find((s) => s.name === ctx.name);
    const tools = (event.tools ?? []).filter((t) => t.startsWith(`mcp__${ctx.name}__`));
    if (server?.status !== 'connected') return fail(client, `claude -p: server ${ctx.name} is ${server?.status ?? 'missing'}`, { command, home });
    return { client, ok: tools.length > 0, tools: tools.length, detail: `mcp list: ${brief(line, 120)}; -p init: ${tools.join(', ')}`, command, home };
  }
  return fail(client, `claude -p printed no init event (${outcome(headless)}): ${brief(headless.output)}`, { command, home });
}

interface RpcMessage {
  id?: number;
  method?: string;
  result?: unknown;
  error?: unknown;
}

/**
 * Codex: `codex mcp add …` exactly as printed, with CODEX_HOME a fresh directory; then
 * `codex app-server` (Codex's own JSON-RPC front end, used by its IDE clients) reports the
 * server's tools and calls one, with no model and no key.
 */
export async function probeCodex(ctx: ProbeContext): Promise<Verdict> {
  const client = 'codex';
  const { home, tmp } = homeOf(ctx, client);
  const codexHome = join(home, '.codex');
  mkdirSync(codexHome, { recursive: true });
  const command = await ctx.addCommand('codex');
  const env = { PATH: SYSTEM_PATH, HOME: home, TMPDIR: tmp, CODEX_HOME: codexHome, OPENAI_API_KEY: '', OPENAI_BASE_URL: 'http://127.0.0.1:9/v1', RUST_LOG: 'error' };
  const [bin, ...args] = argvOf(command, 'codex', ctx.bins.codex);
  const added = await runCapped(bin!, args, { env, timeoutMs: ctx.timeoutMs });
  if (added.code !== 0) return fail(client, `${command}: ${outcome(added)}: ${brief(added.output)}`, { command, home });

  const child = spawn(ctx.bins.codex, ['app-server'], { env, cwd: home, detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => void (stderr = (stderr + d.toString()).slice(-4000)));
  const pending = new Map<number, (m: RpcMessage) => void>();
  createInterface({ input: child.stdout }).on('line', (text) => {
    let m: RpcMessage;
    try {
      m = JSON.parse(text) as RpcMessage;
    } catch {
      return;
    }
    if (m.id !== undefined && (m.result !== undefined || m.error !== undefined)) pending.get(m.id)?.(m);
  });
  let nextId = 1;
  const request = (method: string, params: unknown): Promise<unknown> =>
    new Promise((resolve, reject) => {
      const id = nextId++;
      pending.set(id, (m) => (m.error !== undefined ? reject(new Error(`${method}: ${JSON.stringify(m.error)}`)) : resolve(m.result)));
      child.stdin.write(`${JSON.stringify({ id, method, params })}\n`);
    });
  const deadline = setTimeout(() => {
    for (const settle of pending.values()) settle({ error: 'timed out' });
  }, ctx.timeoutMs);
  try {
    await request('initialize', { clientInfo: { name: 'agent-connectors-gates', title: 'agent-connectors release gates', version: '1' } });
    child.stdin.write(`${JSON.stringify({ method: 'initialized' })}\n`);
    type Status = { data?: { name: string; tools?: Record<string, unknown>; toolsError?: string }[] };
    let entry: NonNullable<Status['data']>[number] | undefined;
    // The server connects in the background after start: ask until it has tools or an error.
    for (let i = 0; i < 20; i++) {
      const status = (await request('mcpServerStatus/list', {})) as Status;
      entry = (status.data ?? []).find((s) => s.name === ctx.name);
      if (entry && (Object.keys(entry.tools ?? {}).length > 0 || entry.toolsError)) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const tools = Object.keys(entry?.tools ?? {});
    if (tools.length === 0) return fail(client, `app-server: no tools (${brief(entry?.toolsError ?? JSON.stringify(entry ?? null))})`, { command, home });
    const thread = (await request('thread/start', {})) as { thread?: { id?: string }; threadId?: string };
    const threadId = thread.thread?.id ?? thread.threadId;
    const called = await request('mcpServer/tool/call', { server: ctx.name, threadId, tool: ctx.call.tool, arguments: ctx.call.args });
    return { client, ok: true, tools: tools.length, detail: `app-server tools: ${tools.join(', ')}; ${ctx.call.tool} → ${brief(JSON.stringify(called), 120)}`, command, home };
  } catch (err) {
    return fail(client, `app-server: ${brief((err as Error).message)} ${brief(stderr, 200)}`, { command, home });
  } finally {
    clearTimeout(deadline);
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

/** OpenClaw's state-lock directory is hard-coded under /tmp: the gate removes what it created there. */
function openclawLocks(): { dir: string; before: Set<string>; existed: boolean } {
  const dir = `/tmp/openclaw-state-locks-${process.getuid?.() ?? 0}`;
  try {
    return { dir, before: new Set(readdirSync(dir)), existed: true };
  } catch {
    return { dir, before: new Set(), existed: false };
  }
}

/**
 * OpenClaw (Node 24): `openclaw mcp add …` exactly as printed, in a throw-away home; then
 * `openclaw mcp probe --json`, its own connectivity check, counts the tools.
 */
export async function probeOpenclaw(ctx: ProbeContext): Promise<Verdict> {
  const client = 'openclaw';
  const { home, tmp } = homeOf(ctx, client);
  const command = await ctx.addCommand('openclaw');
  const env = { PATH: `${ctx.bins.node24Dir}:${SYSTEM_PATH}`, HOME: home, TMPDIR: tmp, OPENCLAW_NO_UPDATE_CHECK: '1' };
  const locks = openclawLocks();
  try {
    // Its log file defaults to /tmp/openclaw; keep it in the throw-away home.
    await runCapped(ctx.bins.openclaw, ['config', 'set', 'logging.file', join(home, 'openclaw.log')], { env, cwd: home, timeoutMs: ctx.timeoutMs });
    const [bin, ...args] = argvOf(command, 'openclaw', ctx.bins.openclaw);
    const added = await runCapped(bin!, args, { env, cwd: home, timeoutMs: ctx.timeoutMs });
    if (added.code !== 0) return fail(client, `${command}: ${outcome(added)}: ${brief(added.output)}`, { command, home });
    const probed = await runCapped(ctx.bins.openclaw, ['mcp', 'probe', '--json'], { env, cwd: home, timeoutMs: ctx.timeoutMs });
    const report = jsonBlock(probed.output) as { servers?: Record<string, { tools?: unknown }>; diagnostics?: { message?: string }[] } | undefined;
    const tools = report?.servers?.[ctx.name]?.tools;
    if (typeof tools !== 'number') return fail(client, `openclaw mcp probe (${outcome(probed)}): ${brief(report?.diagnostics?.[0]?.message ?? probed.output)}`, { command, home });
    return { client, ok: tools > 0, tools, detail: `mcp probe: ${tools} tools`, command, home };
  } finally {
    try {
      for (const f of readdirSync(locks.dir)) if (!locks.before.has(f)) rmSync(join(locks.dir, f), { force: true });
      if (!locks.existed) rmSync(locks.dir, { recursive: true, force: true });
    } catch {
      // it made none
    }
  }
}

/** The first top-level JSON object printed as a block (`{` … `}` on their own lines). */
function jsonBlock(text: string): unknown {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trimEnd() === '{');
  if (start < 0) return undefined;
  for (let end = lines.length - 1; end > start; end--) {
    if (lines[end]!.trimEnd() !== '}') continue;
    try {
      return JSON.parse(lines.slice(start, end + 1).join('\n'));
    } catch {
      // a shorter block, then
    }
  }
  return undefined;
}

/** MCP Inspector's CLI mode, given the plain URL (what `mcp-add` prints without `--agent`). */
export async function probeInspector(ctx: ProbeContext): Promise<Verdict> {
  const client = 'mcp-inspector';
  const { home, tmp } = homeOf(ctx, client);
  const r = await runCapped(ctx.bins.inspector, ['--cli', ctx.url, '--transport', 'http', '--method', 'tools/list'], {
    env: { PATH: SYSTEM_PATH, HOME: home, TMPDIR: tmp },
    cwd: home,
    timeoutMs: ctx.timeoutMs,
  });
  const report = jsonBlock(r.output) as { tools?: { name: string }[] } | undefined;
  if (!Array.isArray(report?.tools)) return fail(client, `mcp-inspector --cli (${outcome(r)}): ${brief(r.output)}`, { home });
  return { client, ok: report.tools.length > 0, tools: report.tools.length, detail: `tools/list: ${report.tools.map((t) => t.name).join(', ')}`, home };
}

async function listAndCall(client: Client, call: ProbeContext['call']): Promise<{ tools: string[]; result: string }> {
  const { tools } = await client.listTools();
  const result = await client.callTool({ name: call.tool, arguments: call.args });
  return { tools: tools.map((t) => t.name), result: brief(JSON.stringify(result.content), 120) };
}

/** mcp-remote, the stdio↔HTTP bridge stdio-only agents use, driven by the SDK's stdio client. */
export async function probeMcpRemote(ctx: ProbeContext): Promise<Verdict> {
  const name = 'mcp-remote';
  const { home, tmp } = homeOf(ctx, name);
  const transport = new StdioClientTransport({
    command: ctx.bins.mcpRemote,
    args: [ctx.url, '--auth-timeout', '5'],
    env: { PATH: SYSTEM_PATH, HOME: home, TMPDIR: tmp, MCP_REMOTE_CONFIG_DIR: join(home, '.mcp-auth') },
    stderr: 'ignore',
    cwd: home,
  });
  const client = new Client({ name: 'agent-connectors-gates', version: '1' });
  try {
    await withTimeout(client.connect(transport), ctx.timeoutMs, 'connect');
    const { tools, result } = await withTimeout(listAndCall(client, ctx.call), ctx.timeoutMs, 'list and call');
    return { client: name, ok: tools.length > 0, tools: tools.length, detail: `tools: ${tools.join(', ')}; ${ctx.call.tool} → ${result}`, home };
  } catch (err) {
    return fail(name, brief((err as Error).message), { home });
  } finally {
    await client.close().catch(() => undefined);
  }
}

/** The official SDK's Streamable HTTP client, the reference any MCP client is held to. */
export async function probeSdk(ctx: ProbeContext): Promise<Verdict> {
  const name = 'sdk-client';
  const client = new Client({ name: 'agent-connectors-gates', version: '1' });
  try {
    await withTimeout(client.connect(new StreamableHTTPClientTransport(new URL(ctx.url))), ctx.timeoutMs, 'connect');
    const { tools, result } = await withTimeout(listAndCall(client, ctx.call), ctx.timeoutMs, 'list and call');
    return { client: name, ok: tools.length > 0, tools: tools.length, detail: `tools: ${tools.join(', ')}; ${ctx.call.tool} → ${result}` };
  } catch (err) {
    return fail(name, brief((err as Error).message));
  } finally {
    await client.close().catch(() => undefined);
  }
}

async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Each probe by the client name it reports. */
export const PROBES: readonly (readonly [string, (ctx: ProbeContext) => Promise<Verdict>])[] = [
  ['sdk-client', probeSdk],
  ['claude-code', probeClaude],
  ['codex', probeCodex],
  ['openclaw', probeOpenclaw],
  ['mcp-inspector', probeInspector],
  ['mcp-remote', probeMcpRemote],
];

/**
 * Calls `visit` for each regular file under `dir` (at most `maxDepth` directories down)
 * until it returns false; unreadable directories are skipped.
 */
export function eachFile(dir: string, visit: (path: string, name: string) => boolean | void, maxDepth = 64): void {
  let stopped = false;
  const walk = (d: string, depth: number): void => {
    let entries;
    try {
      entries = readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (stopped) return;
      const p = join(d, e.name);
      if (e.isDirectory()) {
        if (depth < maxDepth) walk(p, depth + 1);
      } else if (e.isFile() && visit(p, e.name) === false) stopped = true;
    }
  };
  walk(dir, 0);
}

/**
 * Files under `dir` (at most `maxFiles`, each read up to 4 MiB) that contain any of
 * `secrets`: an agent's configuration must hold the URL only.
 */
export function filesHolding(dir: string, secrets: readonly string[], maxFiles = 20_000): { searched: number; hits: string[] } {
  const hits: string[] = [];
  let searched = 0;
  eachFile(dir, (p) => {
    if (searched >= maxFiles) return false;
    searched++;
    let text: string;
    try {
      text = readFileSync(p).subarray(0, 4 * 1024 * 1024).toString('latin1');
    } catch {
      return true;
    }
    if (secrets.some((s) => s.length > 0 && text.includes(s))) hits.push(p);
    return true;
  });
  return { searched, hits };
}
