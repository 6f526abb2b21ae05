import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';
import { sendJson as json } from './fake-http.js';

/**
 * sentry-cli (@sentry/cli from npm: a Rust binary shipped in the registry package
 * @sentry/cli-linux-x64, so the install needs nothing but the registry). Its HTTP client
 * is libcurl, which reads HTTPS_PROXY and SSL_CERT_FILE itself: plain TLS mode.
 */
const TOKEN = `sntryu_${randomBytes(32).toString('hex')}`;
// sentry-cli tells a user token by its prefix and 64 hex digits: the placeholder has that shape.
const PLACEHOLDER = `sntryu_${'0'.repeat(64)}`;
const ORG = 'acme';

function serve(req: IncomingMessage, _body: Buffer, res: ServerResponse): void {
  if (req.headers.authorization !== `Bearer ${TOKEN}`) {
    json(res, 401, { detail: 'Invalid token' });
    return;
  }
  const path = (req.url ?? '').split('?')[0];
  if (req.method === 'GET' && path === '/api/0/') {
    json(res, 200, { version: '0', auth: { scopes: ['org:read', 'project:read', 'project:releases'] }, user: { id: '1', name: 'Agent Tester', email: 'agent@example.com' } });
  } else if (req.method === 'GET' && path === `/api/0/organizations/${ORG}/projects/`) {
    json(res, 200, [
      { id: '4501', slug: 'checkout-web', name: 'checkout-web', team: { id: '7', slug: 'shop', name: 'Shop' }, teams: [{ id: '7', slug: 'shop', name: 'Shop' }] },
      { id: '4502', slug: 'billing-api', name: 'billing-api', team: { id: '7', slug: 'shop', name: 'Shop' }, teams: [{ id: '7', slug: 'shop', name: 'Shop' }] },
    ]);
  } else {
    json(res, 404, { detail: 'The requested resource does not exist' });
  }
}

export const sentryCli: CliCase = {
  name: 'sentry-cli',
  install: { npm: '@sentry/cli', version: '3.8.0', bin: 'sentry-cli' },
  versionArgs: ['--version'],
  providerId: 'sentry',
  provider: {
    mode: 'tls',
    hosts: ['sentry.io', '*.sentry.io'],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    placeholder: PLACEHOLDER,
    commands: [{ name: 'sentry-cli', env: { SENTRY_AUTH_TOKEN: '{placeholder}' } }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['sentry.io', 'us.sentry.io', 'de.sentry.io'],
  serve,
  steps: [
    { script: 'sentry-cli info', expect: /Method: Auth Token[\s\S]*User: agent@example\.com/ },
    { script: `sentry-cli projects list --org ${ORG}`, expect: /\| 4501 \| checkout-web / },
  ],
  command: `sentry-cli info and projects list --org ${ORG}`,
  // No update check or crash report of its own to sentry.io while the gate runs.
  env: { SENTRY_DISABLE_UPDATE_CHECK: 'true' },
};
