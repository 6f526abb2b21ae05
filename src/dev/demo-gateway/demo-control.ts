import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { DesiredBinding, DesiredProvider } from '../../data/desired-state.js';
import {
  DEMO_CONTROL_PATH,
  demoKindSchema,
  demoNameSchema,
  type DemoConnection,
  type DemoControlAnswer,
  type DemoKind,
} from '../demo-wire.js';
import { checkHost, checkOrigin } from '../../http/loopback.js';
import type { HostControl } from './host-control.js';

/**
 * The demo platform's "connect a SaaS" surface for `agent-connectors dev`: a fixed list of
 * demo connections a user turns on and off, each change going into the desired state
 * (HostControl) exactly as the real platform's would. The host learns of it only through
 * its link; nothing here touches a host file.
 *
 *   binding demo, binding sandbox   MCP instances served by the demo Gateway's /mcp
 *   provider demo                   the demo REST API, used by the `acdemo` CLI
 *
 * HTTP (loopback only; a POST must come from a loopback origin or none, so a web page
 * elsewhere cannot flip connections):
 *   GET  /demo                                   the page (plain HTML, one form per button)
 *   GET  /demo/connections                       DemoControlAnswer
 *   POST /demo/connect/<kind>/<name>             → DemoControlAnswer (JSON when asked for
 *   POST /demo/disconnect/<kind>/<name>            with Accept, else 303 back to the page)
 * The page shows names and states, never binding ids: an id is a capability, and dev's
 * own terminal is where its URL is printed.
 */

const DEMO_BINDINGS: Readonly<Record<string, { instanceId: string }>> = {
  demo: { instanceId: 'demo' },
  sandbox: { instanceId: 'sandbox' },
};

/** The provider `demo`: the demo Gateway's REST API, reached by the `acdemo` CLI. */
export const DEMO_PROVIDER = 'demo';
const DEMO_PROVIDER_SLOT = `cli:${DEMO_PROVIDER}`;

function demoProviders(gatewayBase: string): Record<string, DesiredProvider> {
  return {
    [DEMO_PROVIDER]: {
      upstream: `${gatewayBase}/api/demo`,
      inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      commands: [{ name: 'acdemo', env: { ACDEMO_URL: '{baseUrl}', ACDEMO_TOKEN: '{placeholder}' } }],
    },
  };
}

/** The slot whose tokens the demo REST API accepts. */
export function isDemoApiSlot(slot: string): boolean {
  return slot === DEMO_PROVIDER_SLOT;
}

export type DemoAction = 'connect' | 'disconnect';

export class DemoConnections {
  readonly #control: HostControl;
  readonly #gatewayBase: () => string;
  readonly #bindingIds: Record<string, string>;

  /**
   * `bindingIds`: ids remembered from earlier runs, by demo binding name; a name without
   * one gets a fresh random id (`bindingIds` shows them all, for dev to keep).
   */
  constructor(control: HostControl, gatewayBase: () => string, bindingIds: Readonly<Record<string, string>> = {}) {
    this.#control = control;
    this.#gatewayBase = gatewayBase;
    this.#bindingIds = Object.fromEntries(
      Object.keys(DEMO_BINDINGS).map((name) => [name, bindingIds[name] ?? `demo_${randomBytes(16).toString('base64url')}`]),
    );
  }

  get bindingIds(): Readonly<Record<string, string>> {
    return { ...this.#bindingIds };
  }

  /** Demo binding name of a binding id, for the host side's messages. */
  nameOf(bindingId: string): string | undefined {
    return Object.entries(this.#bindingIds).find(([, id]) => id === bindingId)?.[0];
  }

  list(): DemoConnection[] {
    const state = this.#control.state();
    return [
      ...Object.keys(DEMO_BINDINGS).map((name) => ({ kind: 'binding' as const, name, connected: Object.hasOwn(state.bindings, this.#bindingIds[name] ?? '') })),
      ...Object.keys(demoProviders('http://127.0.0.1')).map((name) => ({ kind: 'provider' as const, name, connected: Object.hasOwn(state.providers, name) })),
    ];
  }

  answer(): DemoControlAnswer {
    return { version: this.#control.version, connections: this.list() };
  }

  /** Applies one user action; false for a name that is not a demo connection. */
  change(action: DemoAction, kind: DemoKind, name: string): boolean {
    if (kind === 'binding') {
      const demo = DEMO_BINDINGS[name];
      const bindingId = this.#bindingIds[name];
      if (!Object.hasOwn(DEMO_BINDINGS, name) || !demo || !bindingId) return false;
      const binding: DesiredBinding = { instanceId: demo.instanceId, upstreamUrl: `${this.#gatewayBase()}/mcp` };
      if (action === 'connect') this.#control.connectBinding(bindingId, binding);
      else this.#control.disconnectBinding(bindingId);
      return true;
    }
    const providers = demoProviders(this.#gatewayBase());
    const provider = Object.hasOwn(providers, name) ? providers[name] : undefined;
    if (!provider) return false;
    if (action === 'connect') this.#control.connectProvider(name, provider);
    else this.#control.disconnectProvider(name);
    return true;
  }
}

function send(res: ServerResponse, status: number, type: string, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store', ...headers });
  res.end(body);
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  send(res, status, 'application/json', JSON.stringify(body));
}

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

export function renderDemoPage(answer: DemoControlAnswer): string {
  const rows = answer.connections
    .map((c) => {
      const action: DemoAction = c.connected ? 'disconnect' : 'connect';
      const path = `${DEMO_CONTROL_PATH}/${action}/${c.kind}/${c.name}`;
      return `<tr><td>${escapeHtml(c.kind)}</td><td>${escapeHtml(c.name)}</td><td>${c.connected ? 'connected' : 'not connected'}</td><td><form method="post" action="${escapeHtml(path)}"><button>${action}</button></form></td></tr>`;
    })
    .join('\n');
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>agent-connectors demo platform</title>
<style>body{font-family:sans-serif;margin:2em}td,th{padding:.3em 1em;text-align:left}</style></head>
<body><h1>Demo platform</h1>
<p>Connect or disconnect a demo SaaS. The host learns of it only through its link (desired state version ${answer.version});
watch the terminal running <code>agent-connectors dev</code>.</p>
<table><tr><th>kind</th><th>name</th><th>state</th><th></th></tr>
${rows}
</table></body></html>
`;
}

const CHANGE = new RegExp(`^${DEMO_CONTROL_PATH}/(connect|disconnect)/([^/]+)/([^/]+)$`);

/**
 * Handles the request if it is under /demo (true), else leaves it untouched (false).
 * `port`: the demo Gateway's own, for the Host check.
 */
export function handleDemoControlHttp(connections: DemoConnections, req: IncomingMessage, res: ServerResponse, port: number): boolean {
  const url = new URL(req.url ?? '/', 'http://gateway');
  if (url.pathname !== DEMO_CONTROL_PATH && !url.pathname.startsWith(`${DEMO_CONTROL_PATH}/`)) return false;
  req.resume();
  const host = checkHost(req.headers.host, port);
  const origin = checkOrigin(req.headers.origin);
  if (!host.ok || !origin.ok) {
    sendJson(res, 403, { error: 'forbidden' });
    return true;
  }
  if (url.pathname === DEMO_CONTROL_PATH || url.pathname === `${DEMO_CONTROL_PATH}/connections`) {
    if (req.method !== 'GET') {
      send(res, 405, 'application/json', JSON.stringify({ error: 'method_not_allowed' }), { allow: 'GET' });
    } else if (url.pathname === DEMO_CONTROL_PATH) {
      send(res, 200, 'text/html; charset=utf-8', renderDemoPage(connections.answer()));
    } else {
      sendJson(res, 200, connections.answer());
    }
    return true;
  }
  const m = CHANGE.exec(url.pathname);
  const kind = demoKindSchema.safeParse(m?.[2]);
  const name = demoNameSchema.safeParse(m?.[3]);
  if (!m || !kind.success || !name.success) {
    sendJson(res, 404, { error: 'not_found' });
    return true;
  }
  if (req.method !== 'POST') {
    send(res, 405, 'application/json', JSON.stringify({ error: 'method_not_allowed' }), { allow: 'POST' });
    return true;
  }
  if (!connections.change(m[1] as DemoAction, kind.data, name.data)) {
    sendJson(res, 404, { error: 'unknown_connection' });
    return true;
  }
  if ((req.headers.accept ?? '').includes('application/json')) sendJson(res, 200, connections.answer());
  else send(res, 303, 'text/plain', 'see /demo\n', { location: DEMO_CONTROL_PATH });
  return true;
}
