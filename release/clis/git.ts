import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { join } from 'node:path';
import type { CliCase } from './cli-case.js';

/**
 * git over https (Debian's git), TLS mode: `git clone https://github.com/<org>/<repo>.git`
 * through the git shim. The fake is git's own smart HTTP: the real `git http-backend` CGI
 * behind GitHub's credential check (Basic `x-access-token:<token>`), so what is proven is
 * git's own protocol, not a stand-in. git reads the shim's HTTPS_PROXY and its CA bundle
 * from GIT_SSL_CAINFO; the agent's git holds no credential at all (no helper, no URL user).
 */
const TOKEN = `ghs_${randomBytes(27).toString('base64url').slice(0, 36)}`;
const EXPECTED = `Basic ${Buffer.from(`x-access-token:${TOKEN}`).toString('base64')}`;
const BACKEND = '/usr/lib/git-core/git-http-backend';
const MARKER = `cloned through the cli-proxy ${randomBytes(6).toString('hex')}`;

let projectRoot: string | undefined;

/** `git <args>` as root, committer fixed, no user or system config read. */
function git(args: string[], cwd?: string): void {
  execFileSync('git', args, {
    cwd,
    stdio: 'pipe',
    env: { PATH: '/usr/bin:/bin', HOME: '/nonexistent', GIT_CONFIG_NOSYSTEM: '1', GIT_AUTHOR_NAME: 'Gate', GIT_AUTHOR_EMAIL: 'gate@example.com', GIT_COMMITTER_NAME: 'Gate', GIT_COMMITTER_EMAIL: 'gate@example.com' },
  });
}

/** Runs git-http-backend for one request: the CGI's headers become the response's. */
function backend(req: IncomingMessage, body: Buffer, res: ServerResponse, root: string): void {
  const url = new URL(req.url ?? '/', 'https://github.com');
  const env: Record<string, string> = {
    PATH: '/usr/bin:/bin',
    GIT_PROJECT_ROOT: root,
    GIT_HTTP_EXPORT_ALL: '1',
    GIT_CONFIG_NOSYSTEM: '1',
    HOME: '/nonexistent',
    REQUEST_METHOD: req.method ?? 'GET',
    PATH_INFO: decodeURIComponent(url.pathname),
    QUERY_STRING: url.search.slice(1),
    CONTENT_TYPE: req.headers['content-type'] ?? '',
    CONTENT_LENGTH: String(body.length),
    REMOTE_ADDR: '127.0.0.1',
    REMOTE_USER: 'x-access-token',
  };
  if (req.headers['content-encoding']) env.HTTP_CONTENT_ENCODING = req.headers['content-encoding'];
  if (typeof req.headers['git-protocol'] === 'string') env.GIT_PROTOCOL = req.headers['git-protocol'];
  const cgi = spawn(BACKEND, [], { env, stdio: ['pipe', 'pipe', 'pipe'] });
  const out: Buffer[] = [];
  cgi.stdout.on('data', (c: Buffer) => out.push(c));
  cgi.stderr.resume();
  cgi.stdin.on('error', () => undefined);
  cgi.stdin.end(body);
  cgi.once('close', (code) => {
    const all = Buffer.concat(out);
    const split = all.indexOf('\r\n\r\n');
    if (code !== 0 || split === -1) {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(`git http-backend exited ${code}`);
      return;
    }
    let status = 200;
    const headers: Record<string, string> = {};
    for (const line of all.subarray(0, split).toString('latin1').split('\r\n')) {
      const at = line.indexOf(':');
      const name = line.slice(0, at).trim();
      const value = line.slice(at + 1).trim();
      if (name.toLowerCase() === 'status') status = Number(value.split(' ')[0]);
      else headers[name] = value;
    }
    const payload = all.subarray(split + 4);
    res.writeHead(status, { ...headers, 'content-length': payload.length });
    res.end(payload);
  });
}

export const gitHttps: CliCase = {
  name: 'git',
  install: { apt: 'git', bin: '/usr/bin/git' },
  versionArgs: ['--version'],
  providerId: 'github-git',
  provider: {
    mode: 'tls',
    hosts: ['github.com'],
    inject: { type: 'basic', username: 'x-access-token', password: '{token}' },
    commands: [{ name: 'git', env: {} }],
  },
  token: TOKEN,
  secrets: [TOKEN, EXPECTED.slice('Basic '.length)],
  hosts: ['github.com'],
  setup(dir) {
    // github.com/acme/widgets.git: a bare repository with one commit.
    const work = join(dir, 'work');
    mkdirSync(work);
    git(['init', '-q', '-b', 'main', work]);
    writeFileSync(join(work, 'README.md'), `${MARKER}\n`);
    git(['add', 'README.md'], work);
    git(['commit', '-q', '-m', 'first'], work);
    projectRoot = join(dir, 'repos');
    mkdirSync(join(projectRoot, 'acme'), { recursive: true });
    git(['clone', '-q', '--bare', work, join(projectRoot, 'acme', 'widgets.git')]);
  },
  serve(req, body, res) {
    if (req.headers.authorization !== EXPECTED) {
      // GitHub's answer to a clone without a usable credential.
      res.writeHead(401, { 'www-authenticate': 'Basic realm="GitHub"', 'content-type': 'text/plain' });
      res.end('Invalid username or password.\n');
      return;
    }
    if (!projectRoot) throw new Error('the git case was not set up');
    backend(req, body, res, projectRoot);
  },
  steps: [{ script: 'git clone -q https://github.com/acme/widgets.git && cat widgets/README.md && git -C widgets log --format=%s', expect: new RegExp(`${MARKER}\\nfirst`) }],
  command: 'git clone https://github.com/acme/widgets.git',
  // A missing credential must fail, not wait at a prompt nobody answers.
  env: { GIT_TERMINAL_PROMPT: '0' },
};
