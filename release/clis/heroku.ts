import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';
import { sendJson as json } from './fake-http.js';

/**
 * The Heroku CLI from npm (oclif). Its HTTP client (@heroku/http-call) tunnels through
 * HTTPS_PROXY itself and, behind a proxy, trusts SSL_CERT_FILE: both come from the shim in
 * TLS mode. HEROKU_API_KEY is sent as a Bearer token.
 */
const TOKEN = `HRKU-${randomBytes(30).toString('base64url')}`;
const EMAIL = 'ops@acme.example';

function app(name: string, owner: string): Record<string, unknown> {
  return { id: `01234567-89ab-cdef-0123-${name.length.toString().padStart(12, '0')}`, name, owner: { email: owner, id: '5e2b' }, region: { name: 'us' }, space: null, locked: false, internal_routing: null };
}

function serve(req: IncomingMessage, _body: Buffer, res: ServerResponse): void {
  if (req.headers.authorization !== `Bearer ${TOKEN}`) {
    json(res, 401, { id: 'unauthorized', message: 'Invalid credentials provided.' });
    return;
  }
  const path = (req.url ?? '').split('?')[0];
  if (req.method === 'GET' && path === '/account') json(res, 200, { email: EMAIL, id: '5e2b0c1d-8f3a-4c5e-9b7d-2a1f0e3c4d5b', name: 'Acme Ops' });
  else if (req.method === 'GET' && path === '/users/~/apps') json(res, 200, [app('acme-web', EMAIL), app('acme-worker', 'dev@acme.example')]);
  else json(res, 404, { id: 'not_found', message: 'Not found.' });
}

export const heroku: CliCase = {
  name: 'heroku',
  install: { npm: 'heroku', version: '11.10.0', bin: 'heroku' },
  versionArgs: ['--version'],
  providerId: 'heroku',
  provider: {
    mode: 'tls',
    hosts: ['api.heroku.com'],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    commands: [{ name: 'heroku', env: { HEROKU_API_KEY: '{placeholder}' } }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['api.heroku.com'],
  serve,
  steps: [
    { script: 'heroku apps', expect: /ops@acme\.example Apps[\s\S]*acme-web[\s\S]*acme-worker/ },
    { script: 'heroku auth:whoami', expect: /^ops@acme\.example$/m },
  ],
  command: 'heroku apps and auth:whoami',
  // No telemetry, no update check (oclif asks the npm registry), and no autoupdate: oclif's
  // init hook otherwise leaves a detached `heroku update --autoupdate` running as the agent.
  env: { DISABLE_TELEMETRY: 'true', HEROKU_SKIP_NEW_VERSION_CHECK: 'true', HEROKU_DISABLE_AUTOUPDATE: '1' },
};
