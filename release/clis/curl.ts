import { randomBytes } from 'node:crypto';
import type { CliCase } from './cli-case.js';
import { sendJson } from './fake-http.js';

/**
 * curl (Debian's), TLS mode, against GitLab's REST API: the agent calls the API with no
 * credential at all and the cli-proxy adds GitLab's `PRIVATE-TOKEN` header. curl is one of
 * the host's own tools (SPEC §10's deny list): the gate allows it the way an operator
 * would, in its allowed-commands file.
 */
const TOKEN = `glpat-${randomBytes(15).toString('base64url')}`;

export const curl: CliCase = {
  name: 'curl',
  install: { apt: 'curl', bin: '/usr/bin/curl' },
  versionArgs: ['--version'],
  providerId: 'gitlab-api',
  provider: {
    mode: 'tls',
    hosts: ['gitlab.com'],
    inject: { type: 'header', name: 'PRIVATE-TOKEN', value: '{token}' },
    commands: [{ name: 'curl', env: {} }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['gitlab.com'],
  serve(req, _body, res) {
    const json = (status: number, value: unknown): void => sendJson(res, status, value);
    if (req.headers['private-token'] !== TOKEN) return json(401, { message: '401 Unauthorized' });
    if (req.method === 'GET' && req.url === '/api/v4/user') return json(200, { id: 4242, username: 'real-gitlab-user', state: 'active' });
    return json(404, { message: '404 Not Found' });
  },
  steps: [{ script: 'curl -fsS https://gitlab.com/api/v4/user', expect: /"username":"real-gitlab-user"/ }],
  command: 'curl -fsS https://gitlab.com/api/v4/user',
};
