import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';
import { sendJson } from './fake-http.js';

/**
 * wrangler (Cloudflare). Node CLI: it installs undici's EnvHttpProxyAgent as the global
 * dispatcher when HTTPS_PROXY is set, and Node reads NODE_EXTRA_CA_CERTS at start, so the
 * shim's TLS-mode variables serve it as they are. 4.86.0 is the last release that runs on
 * Node 20 (engines >=20.3; 4.87 on want Node 22).
 */
const TOKEN = randomBytes(30).toString('base64url');
const ACCOUNT = { id: '9a7b3c5d1e2f40718293a4b5c6d7e8f9', name: 'Acme Ops' };

/** The Cloudflare API v4 envelope. */
function reply(res: ServerResponse, status: number, result: unknown, errors: ReadonlyArray<{ code: number; message: string }> = [], count?: number): void {
  const body: Record<string, unknown> = { success: errors.length === 0, errors, messages: [], result };
  if (count !== undefined) body.result_info = { page: 1, per_page: 100, count, total_count: count, total_pages: 1 };
  sendJson(res, status, body);
}

function serve(req: IncomingMessage, _body: Buffer, res: ServerResponse): void {
  if (req.headers.authorization !== `Bearer ${TOKEN}`) {
    reply(res, 401, null, [{ code: 10000, message: 'Authentication error' }]);
    return;
  }
  const path = (req.url ?? '').split('?')[0];
  const get = req.method === 'GET';
  if (get && path === '/client/v4/user/tokens/verify') reply(res, 200, { id: 'ed17574386854bf78a67040be0a770b0', status: 'active' });
  else if (get && path === '/client/v4/user') reply(res, 200, { id: '7c5dae5552338874e5053f2534d2767a', email: 'ops@acme.example' });
  else if (get && path === '/client/v4/accounts') reply(res, 200, [ACCOUNT], [], 1);
  else if (get && path === '/client/v4/memberships') reply(res, 200, [{ id: '4536bcfad5faccb111b47003c79917fa', account: ACCOUNT, roles: ['Administrator'], status: 'accepted' }], [], 1);
  else if (get && path === `/client/v4/accounts/${ACCOUNT.id}/storage/kv/namespaces`) {
    // As the real API: past the last page an empty list (wrangler pages until one comes back empty).
    const page = Number(new URL(req.url ?? '/', 'https://api.cloudflare.com').searchParams.get('page') ?? '1');
    reply(res, 200, page > 1 ? [] : [{ id: '0f2ac74b498b48028cb68387c421e279', title: 'sessions-prod', supports_url_encoding: true }], [], 1);
  } else reply(res, 404, null, [{ code: 7003, message: 'No route for that URI' }]);
}

export const wrangler: CliCase = {
  name: 'wrangler',
  install: { npm: 'wrangler', version: '4.86.0', bin: 'wrangler' },
  versionArgs: ['--version'],
  providerId: 'cloudflare',
  provider: {
    mode: 'tls',
    hosts: ['api.cloudflare.com'],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    commands: [{ name: 'wrangler', env: { CLOUDFLARE_API_TOKEN: '{placeholder}' } }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['api.cloudflare.com'],
  serve,
  steps: [
    { script: 'wrangler whoami', expect: /associated with the email ops@acme\.example[\s\S]*Acme Ops/ },
    { script: 'cd "$HOME" && wrangler kv namespace list', expect: /"title": "sessions-prod"/ },
  ],
  command: 'wrangler whoami and kv namespace list',
  // No telemetry to sparrow.cloudflare.com, no banner (whose update check asks the npm registry).
  env: { WRANGLER_SEND_METRICS: 'false', WRANGLER_HIDE_BANNER: 'true', CI: 'true' },
};
