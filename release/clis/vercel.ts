import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';
import { sendJson as json } from './fake-http.js';

/**
 * The Vercel CLI from npm. It routes fetch through HTTPS_PROXY (undici's ProxyAgent) when a
 * proxy variable is set, and Node reads NODE_EXTRA_CA_CERTS: TLS mode. Its credential is
 * the `--token` flag (VERCEL_TOKEN too, since 2025), so the catalog puts it first in
 * `commands[].args` (SPEC §10). 60.1.3: the newest whose dependencies all resolve from the
 * registry here (61-64 need `sandbox@4.4.0`, which it does not serve).
 */
const TOKEN = randomBytes(12).toString('hex');
// vercel refuses a --token holding anything but [A-Za-z0-9_] (its `\W` check).
const PLACEHOLDER = 'agentconnectors000000000';
const USER = { id: 'Q4fgW8LRtj1h0PzKqXbnD5cT', username: 'acme-ops', email: 'ops@acme.example', name: 'Acme Ops', defaultTeamId: null, version: 'northstar' };

function serve(req: IncomingMessage, _body: Buffer, res: ServerResponse): void {
  if (req.headers.authorization !== `Bearer ${TOKEN}`) {
    json(res, 403, { error: { code: 'forbidden', message: 'The request is missing an authentication token', invalidToken: true } });
    return;
  }
  const path = (req.url ?? '').split('?')[0];
  if (req.method === 'GET' && path === '/v2/user') json(res, 200, { user: USER });
  else if (req.method === 'GET' && /^\/v\d+\/projects$/.test(path ?? '')) {
    json(res, 200, {
      projects: [{ id: 'prj_8Hc2kLm4Nq6Rs8Tu0Vw2Xy4Za', name: 'storefront', accountId: USER.id, updatedAt: Date.now() - 3_600_000, createdAt: Date.now() - 86_400_000, framework: 'nextjs', latestDeployments: [] }],
      pagination: { count: 1, next: null, prev: null },
    });
  } else json(res, 404, { error: { code: 'not_found', message: 'Not Found' } });
}

export const vercel: CliCase = {
  name: 'vercel',
  install: { npm: 'vercel', version: '60.1.3', bin: 'vercel' },
  versionArgs: ['--version'],
  providerId: 'vercel',
  provider: {
    mode: 'tls',
    hosts: ['api.vercel.com'],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    placeholder: PLACEHOLDER,
    commands: [{ name: 'vercel', args: ['--token', '{placeholder}'] }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['api.vercel.com'],
  serve,
  steps: [
    { script: 'vercel whoami', expect: /^acme-ops$/m },
    { script: 'vercel project ls --json', expect: /"name": "storefront"/ },
  ],
  command: 'vercel whoami and project ls (token by --token)',
  // No telemetry, no update notice (it asks the npm registry).
  env: { VERCEL_TELEMETRY_DISABLED: '1', NO_UPDATE_NOTIFIER: '1' },
};
