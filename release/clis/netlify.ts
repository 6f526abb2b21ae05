import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';
import { sendJson as json } from './fake-http.js';

/**
 * netlify-cli from npm. It builds an https-proxy-agent from HTTP_PROXY/HTTPS_PROXY for its
 * API client (node-fetch), and Node reads NODE_EXTRA_CA_CERTS: TLS mode. 26.2.0 is the last
 * release that runs on Node 20 (27 wants Node 22.13).
 */
const TOKEN = `nfp_${randomBytes(27).toString('base64url').slice(0, 36)}`;
const SITES = [
  { id: '3d2a9e6f-5b1c-4f7e-8a0d-9c6b2e1f4a70', site_id: '3d2a9e6f-5b1c-4f7e-8a0d-9c6b2e1f4a70', name: 'acme-docs', url: 'https://acme-docs.netlify.app', ssl_url: 'https://acme-docs.netlify.app', account_name: 'Acme Ops', account_slug: 'acme-ops', admin_url: 'https://app.netlify.com/projects/acme-docs', build_settings: {} },
];

function serve(req: IncomingMessage, _body: Buffer, res: ServerResponse): void {
  if (req.headers.authorization !== `Bearer ${TOKEN}`) {
    json(res, 401, { code: 401, message: 'Access Denied: Invalid token' });
    return;
  }
  const path = (req.url ?? '').split('?')[0];
  if (req.method === 'GET' && path === '/api/v1/sites') json(res, 200, SITES);
  else if (req.method === 'GET' && path === '/api/v1/user') json(res, 200, { id: '5f1e', email: 'ops@acme.example', full_name: 'Acme Ops', slug: 'acme-ops' });
  else if (req.method === 'GET' && path === '/api/v1/accounts') json(res, 200, [{ id: '6a2f', name: 'Acme Ops', slug: 'acme-ops', type_name: 'Starter' }]);
  else json(res, 404, { code: 404, message: 'Not Found' });
}

export const netlify: CliCase = {
  name: 'netlify',
  install: { npm: 'netlify-cli', version: '26.2.0', bin: 'netlify' },
  versionArgs: ['--version'],
  providerId: 'netlify',
  provider: {
    mode: 'tls',
    hosts: ['api.netlify.com'],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    commands: [{ name: 'netlify', env: { NETLIFY_AUTH_TOKEN: '{placeholder}' } }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['api.netlify.com'],
  serve,
  steps: [
    { script: 'netlify api getCurrentUser', expect: /"email": "ops@acme\.example"/ },
    { script: 'netlify sites:list --json', expect: /"name": "acme-docs"/ },
  ],
  command: 'netlify api getCurrentUser and sites:list --json',
};
