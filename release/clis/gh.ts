import { randomBytes } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { CliCase } from './cli-case.js';
import { sendJson } from './fake-http.js';

/**
 * GitHub's CLI (Debian's `gh`), TLS mode: gh talks https to api.github.com whatever the
 * environment says, so the cli-proxy intercepts that host. gh takes the credential from
 * GH_TOKEN: the shim gives it a placeholder in the format of a classic personal access
 * token; the fake answers only the real one (`Authorization: token <real>`, as gh sends it).
 * `gh repo list` is one GraphQL query (the viewer's repositories), `gh api user` one REST call.
 */
const TOKEN = `ghp_${randomBytes(27).toString('base64url').slice(0, 36)}`;
const LOGIN = 'real-gh-user';

function json(res: ServerResponse, status: number, value: unknown): void {
  sendJson(res, status, value, { 'content-type': 'application/json; charset=utf-8', 'x-oauth-scopes': 'repo, read:org' });
}

const REPOS = [
  { name: 'widgets', description: 'Widgets, served by the fake', isPrivate: false },
  { name: 'gadgets', description: 'Private gadgets', isPrivate: true },
].map((r) => ({
  ...r,
  nameWithOwner: `${LOGIN}/${r.name}`,
  owner: { login: LOGIN },
  isFork: false,
  isArchived: false,
  visibility: r.isPrivate ? 'PRIVATE' : 'PUBLIC',
  pushedAt: '2026-11-30T12:00:00Z',
  updatedAt: '2026-11-30T12:00:00Z',
}));

export const gh: CliCase = {
  name: 'gh',
  install: { apt: 'gh', bin: '/usr/bin/gh' },
  versionArgs: ['--version'],
  providerId: 'github',
  provider: {
    mode: 'tls',
    hosts: ['api.github.com'],
    inject: { type: 'header', name: 'Authorization', value: 'token {token}' },
    placeholder: 'ghp_agentconnectors000000000000000000000',
    commands: [{ name: 'gh', env: { GH_TOKEN: '{placeholder}' } }],
  },
  token: TOKEN,
  secrets: [TOKEN],
  hosts: ['api.github.com'],
  serve(req, body, res) {
    if (req.headers.authorization !== `token ${TOKEN}`) {
      json(res, 401, { message: 'Bad credentials', documentation_url: 'https://docs.github.com/rest' });
      return;
    }
    const path = (req.url ?? '').split('?')[0];
    if (req.method === 'GET' && path === '/user') {
      json(res, 200, { login: LOGIN, id: 4242, type: 'User', name: 'Real GH User' });
      return;
    }
    if (req.method === 'POST' && path === '/graphql') {
      const query = (JSON.parse(body.toString('utf8')) as { query?: string }).query ?? '';
      if (/repositories\(/.test(query)) {
        json(res, 200, { data: { viewer: { login: LOGIN }, repositoryOwner: { login: LOGIN, repositories: { totalCount: REPOS.length, nodes: REPOS, pageInfo: { hasNextPage: false, endCursor: null } } } } });
        return;
      }
      if (/viewer\s*\{\s*login/.test(query)) {
        json(res, 200, { data: { viewer: { login: LOGIN } } });
        return;
      }
    }
    json(res, 404, { message: `Not Found (the fake serves no ${req.method} ${path})` });
  },
  steps: [
    { script: 'gh repo list', expect: new RegExp(`${LOGIN}/widgets\\s.*${LOGIN}/gadgets`, 's') },
    { script: 'gh api user', expect: new RegExp(`"login":\\s*"${LOGIN}"`) },
  ],
  command: 'gh repo list; gh api user',
  // Non-interactive like an agent's shell: no update check, no prompt, no pager.
  env: { GH_NO_UPDATE_NOTIFIER: '1', GH_PROMPT_DISABLED: '1', GH_PAGER: 'cat', NO_COLOR: '1' },
};
