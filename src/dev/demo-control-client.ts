import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Agent } from 'undici';
import {
  DEMO_CONTROL_PATH,
  DEV_RUNTIME_FILE,
  demoControlAnswerSchema,
  parseDevRuntime,
  type DemoKind,
  type DevRuntime,
} from './demo-wire.js';
import { readAppliedState } from '../data/applied-state.js';
import { parseJsonWith } from '../data/parse.js';
import { stateLayout } from '../data/state-layout.js';
import { ConfigError } from '../errors.js';
import { atomicWrite } from '../fs/atomic-write.js';
import { processAlive } from '../fs/process-alive.js';

/**
 * `agent-connectors dev connect|disconnect <binding|provider> <name>`: the user's click in
 * the demo platform, from a second terminal. It asks the running dev's demo Gateway to
 * change the desired state, then waits until the host's proxies show the change (the
 * binding or provider answers, or answers 404), and says how long that took: what the
 * platform's user would see, end to end, with no file on the host edited by hand.
 */

export function devRuntimePath(stateDir: string): string {
  return join(stateDir, DEV_RUNTIME_FILE);
}

export async function readDevRuntime(stateDir: string): Promise<DevRuntime | undefined> {
  const text = await readFile(devRuntimePath(stateDir), 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  const parsed = parseDevRuntime(text);
  return parsed.ok ? parsed.value : undefined;
}

/** 0600: the binding ids in it are capabilities. */
export async function writeDevRuntime(stateDir: string, runtime: DevRuntime): Promise<void> {
  await atomicWrite(devRuntimePath(stateDir), `${JSON.stringify(runtime, null, 2)}\n`, { mode: 0o600 });
}

/** What the proxies answer for one binding or provider. */
type Seen = 'served' | 'gone' | 'pending';

async function look(agent: Agent, url: string): Promise<Seen> {
  try {
    const u = new URL(url);
    const res = await agent.request({ origin: u.origin, path: u.pathname, method: 'GET', headers: { accept: 'application/json, text/event-stream' } });
    const text = await res.body.text();
    let code: unknown;
    try {
      code = (JSON.parse(text) as { error?: unknown } | null)?.error;
    } catch {
      code = undefined;
    }
    // The proxies' own answers, by their stable codes; anything else came from upstream.
    if (res.statusCode === 404 && (code === 'unknown_binding' || code === 'unknown_provider')) return 'gone';
    if (res.statusCode === 503 && code === 'token_unavailable') return 'pending';
    return 'served';
  } catch {
    return 'pending';
  }
}

export interface DemoChange {
  stateDir: string;
  action: 'connect' | 'disconnect';
  kind: DemoKind;
  name: string;
  timeoutMs: number;
  say: (line: string) => void;
}

export async function changeDemoConnection(change: DemoChange): Promise<void> {
  const runtime = await readDevRuntime(change.stateDir);
  if (!runtime?.gateway || runtime.pid === null || !processAlive(runtime.pid)) {
    throw new ConfigError(`no agent-connectors dev is running with state in ${change.stateDir}: start it (npm run dev), or give its --state-dir`);
  }
  const agent = new Agent({ headersTimeout: 10_000, bodyTimeout: 10_000, connect: { timeout: 5_000 } });
  try {
    const started = Date.now();
    const res = await agent.request({
      origin: new URL(runtime.gateway).origin,
      path: `${DEMO_CONTROL_PATH}/${change.action}/${change.kind}/${change.name}`,
      method: 'POST',
      headers: { accept: 'application/json' },
    });
    const text = await res.body.text();
    if (res.statusCode === 404) {
      throw new ConfigError(`the demo platform has no ${change.kind} named "${change.name}": bindings demo, sandbox; provider demo`);
    }
    const answer = parseJsonWith(demoControlAnswerSchema, text);
    if (res.statusCode !== 200 || !answer.ok) throw new Error(`the demo Gateway answered HTTP ${res.statusCode}`);
    change.say(`${change.kind} ${change.name} ${change.action}ed in the demo platform (desired state version ${answer.value.version})`);

    const url = probeUrl(runtime, change);
    if (!url) return;
    const want: Seen = change.action === 'connect' ? 'served' : 'gone';
    // Probe only once apply has the version in force: before that, a request through a
    // binding the Gateway just revoked meets a 401 and the proxy waits for a new token.
    const handoff = stateLayout(change.stateDir).handoff;
    for (;;) {
      const applied = await readAppliedState(handoff);
      if (applied?.appliedAt && applied.version >= answer.value.version && (await look(agent, url)) === want) break;
      if (Date.now() - started > change.timeoutMs) {
        throw new Error(`the host did not show the change within ${change.timeoutMs} ms; see dev's output`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    const ms = Date.now() - started;
    change.say(
      want === 'served'
        ? `host: served after ${ms} ms at ${displayUrl(runtime, change)}`
        : `host: gone after ${ms} ms: the ${change.kind === 'binding' ? 'forwarder' : 'cli-proxy'} answers 404 (dev's output says when its token file is deleted)`,
    );
  } finally {
    await agent.close();
  }
}

/** Where the proxies answer for this connection (a demo API path for the provider). */
function probeUrl(runtime: DevRuntime, change: DemoChange): string | undefined {
  if (change.kind === 'binding') {
    const id = runtime.bindingIds[change.name];
    return id && runtime.forwarder ? `${runtime.forwarder}/i/${id}/mcp` : undefined;
  }
  return runtime.cliProxy ? `${runtime.cliProxy}/p/${change.name}/whoami` : undefined;
}

function displayUrl(runtime: DevRuntime, change: DemoChange): string {
  if (change.kind === 'binding') return probeUrl(runtime, change) ?? '';
  return `${runtime.cliProxy ?? ''}/p/${change.name}`;
}
