import { randomBytes } from 'node:crypto';
import type { CliCase } from './cli-case.js';
import { sendJson } from './fake-http.js';

/**
 * HTTPie (Debian's `httpie`, the `http` command), TLS mode, against Notion's API: the agent
 * sends no credential, the cli-proxy adds the integration token. HTTPie is Python
 * (requests), so it trusts the shim's REQUESTS_CA_BUNDLE. Its first run would start a
 * background fetch of packages.httpie.io for update warnings (a host outside the catalog,
 * tunnelled untouched); the step turns that off in HTTPie's own config, as a user of an
 * offline box does.
 */
const TOKEN = `ntn_${randomBytes(30).toString('base64url')}`;

export const httpie: CliCase = {
  name: 'httpie',
  install: { apt: 'httpie', bin: '/usr/bin/http' },
  versionArgs: ['--version'],
  providerId: 'notion',
  provider: {
    mode: 'tls',
    hosts: ['api.notion.com'],
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    commands: [{ name: 'http', env: {} }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['api.notion.com'],
  serve(req, _body, res) {
    const json = (status: number, value: unknown): void => sendJson(res, status, value);
    if (req.headers.authorization !== `Bearer ${TOKEN}`) return json(401, { object: 'error', status: 401, code: 'unauthorized', message: 'API token is invalid.' });
    if (req.method === 'GET' && req.url === '/v1/users/me') return json(200, { object: 'user', id: 'b0b0b0b0-0000-4000-8000-000000000001', name: 'Real Notion Bot', type: 'bot' });
    return json(404, { object: 'error', status: 404, code: 'object_not_found', message: 'Not found.' });
  },
  steps: [
    {
      script: 'mkdir -p "$HOME/.config/httpie" && echo \'{"disable_update_warnings": true}\' > "$HOME/.config/httpie/config.json" && http --ignore-stdin --body GET https://api.notion.com/v1/users/me Notion-Version:2022-06-28',
      expect: /"name":\s*"Real Notion Bot"/,
    },
  ],
  command: 'http GET https://api.notion.com/v1/users/me',
};
