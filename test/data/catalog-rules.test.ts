import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import t from 'tap';
import { parseCatalog } from '../../src/data/catalog.js';
import { commandNameProblem, DENIED_COMMAND_GROUPS, DENIED_ENV, envNameProblem, hostToolGroup, hostToolProblem } from '../../src/data/catalog-rules.js';
import { parseDesiredState } from '../../src/data/desired-state.js';
import { REPO_ROOT } from '../support/cli-proc.js';


t.test('command names: plain file names only', async (t) => {
  for (const name of ['ntn', 'gh', 'aws', 'stripe', 'acme-cli', 'my_tool', 'tool.v2', 'x', '1password', 'a'.repeat(64), 'git']) {
    t.equal(commandNameProblem(name), undefined, `${name}: allowed`);
  }
  for (const name of ['', '.', '..', '.profile', '.bashrc', '-rf', '--help', 'a/b', '../bin/sh', 'a b', 'c++', 'x\ny', 'x\0', 'é', 'a'.repeat(65), 'name;id', '$(id)']) {
    t.match(commandNameProblem(name), /plain file name/, `${JSON.stringify(name)}: refused by its syntax`);
  }
});

t.test("command names: the host's own tools are refused, name by name, unless the operator allows them", async (t) => {
  const samples: Record<string, string[]> = {
    shells: ['sh', 'bash', 'dash', 'zsh', 'fish', 'ksh', 'csh', 'tcsh', 'busybox'],
    coreutils: ['ls', 'cat', 'cp', 'mv', 'rm', 'id', 'chmod', 'chown', 'dd', 'echo', 'head', 'printenv', 'tee', 'test', 'true', 'whoami', 'yes', 'sha256sum'],
    'util-linux, findutils, grep, sed, awk, archivers, procps': ['mount', 'find', 'grep', 'sed', 'awk', 'gawk', 'tar', 'gzip', 'less', 'which', 'curl', 'ps'],
    privilege: ['sudo', 'su', 'doas', 'pkexec', 'runuser', 'setpriv'],
    'process wrappers': ['exec'],
    interpreters: ['python', 'python3', 'python3.12', 'perl', 'perl5.36', 'ruby', 'ruby3.1', 'node', 'nodejs', 'deno', 'bun', 'php', 'php8.2', 'lua', 'lua5.4', 'tclsh', 'tclsh8.6', 'java'],
    'package managers': ['apt', 'apt-get', 'dpkg', 'dpkg-deb', 'snap', 'pip', 'pip3', 'npm', 'npx', 'yarn', 'pnpm', 'gem', 'cargo'],
    'remote access': ['ssh', 'scp', 'sftp'],
    'services and scheduling': ['systemctl', 'journalctl', 'crontab'],
    accounts: ['passwd'],
    'this product': ['agent-connectors'],
  };
  for (const [group, names] of Object.entries(samples)) {
    for (const name of names) {
      const problem = commandNameProblem(name);
      t.match(problem, /one of the host's own tools/, `${name}: refused`);
      t.equal(hostToolGroup(name), group, `${name}: in ${group}`);
      t.equal(commandNameProblem(name, new Set([name])), undefined, `${name}: allowed by the operator`);
    }
  }
  // Wrappers that are also coreutils report the first group; they are refused either way.
  for (const name of ['env', 'nohup', 'timeout', 'nice', 'xargs', 'login']) t.ok(hostToolGroup(name), `${name}: denied`);
  t.equal(commandNameProblem('ls', new Set(['cat'])), commandNameProblem('ls'), 'an allowance is for its own name only');
  t.equal(hostToolGroup('github'), undefined, 'a prefix of a name is not the name (gh, github)');
  t.equal(hostToolGroup('lsx'), undefined);
  t.equal(hostToolGroup('git'), undefined, 'git stays allowed: agents use it with a provider');
});

t.test('hostToolProblem names the provider, the command and the rule', async (t) => {
  const providers = { notes: { commands: [{ name: 'ntn' }] }, evil: { commands: [{ name: 'ok-cli' }, { name: 'sudo' }] } };
  t.equal(hostToolProblem(providers, new Set()), 'providers.evil.commands.1.name: command "sudo" is one of the host\'s own tools (privilege); only the operator may allow it, in the allowed-commands file');
  t.equal(hostToolProblem(providers, new Set(['sudo'])), undefined);
  t.equal(hostToolProblem({}, new Set()), undefined);
});

t.test('environment names: the allow rule (upper case) and the deny list, name by name', async (t) => {
  const allowed = [
    'NOTION_API_BASE_URL', 'NOTION_TOKEN', 'GH_TOKEN', 'GH_HOST', 'GITHUB_TOKEN', 'GITLAB_TOKEN', 'AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY',
    'AWS_SESSION_TOKEN', 'AWS_REGION', 'AWS_ENDPOINT_URL', 'STRIPE_API_KEY', 'STRIPE_API_BASE', 'LINEAR_API_KEY', 'NPM_TOKEN', 'ACDEMO_URL',
    'CONFLUENCE_BASE_URL', 'HISTORY_API_URL', 'GOOGLE_CLOUD_PROJECT', 'PROXYCURL_API_KEY', 'X', 'X1',
  ];
  for (const name of allowed) t.equal(envNameProblem(name), undefined, `${name}: allowed`);
  const shape = ['real', 'path', 'http_proxy', 'npm_config_registry', '_JAVA_OPTIONS', '__ac_real', '__AC_REAL', '1X', 'A-B', 'A=B', 'A B', '', 'X'.repeat(129), 'BASH_FUNC_x%%'];
  for (const name of shape) t.ok(envNameProblem(name), `${JSON.stringify(name)}: refused by the allow rule`);
  const denied = [
    // the shell and the login
    'PATH', 'IFS', 'ENV', 'BASH_ENV', 'CDPATH', 'PS1', 'PS2', 'PS3', 'PS4', 'PROMPT_COMMAND', 'HOME', 'SHELL', 'USER', 'LOGNAME', 'TMPDIR', 'TERM',
    'INPUTRC', 'ZDOTDIR', 'SHELLOPTS', 'BASHOPTS', 'HISTFILE', 'BASH_XTRACEFD',
    // loader and libc
    'LD_PRELOAD', 'LD_LIBRARY_PATH', 'LD_AUDIT', 'GCONV_PATH', 'MALLOC_CHECK_', 'MALLOC_ARENA_MAX', 'GLIBC_TUNABLES', 'LOCPATH', 'NLSPATH', 'HOSTALIASES',
    'RES_OPTIONS', 'LOCALDOMAIN', 'TZ', 'TZDIR', 'TERMINFO', 'TERMINFO_DIRS',
    // locale
    'LANG', 'LANGUAGE', 'LC_ALL', 'LC_CTYPE', 'LC_MESSAGES',
    // runtimes
    'NODE_OPTIONS', 'NODE_PATH', 'NODE_EXTRA_CA_CERTS', 'NODE_TLS_REJECT_UNAUTHORIZED', 'NODE_REPL_EXTERNAL_MODULE', 'NPM_CONFIG_REGISTRY',
    'NPM_CONFIG_SCRIPT_SHELL', 'YARN_RC_FILENAME', 'PYTHONPATH', 'PYTHONSTARTUP', 'PYTHONHOME', 'PYTHONWARNINGS', 'PIP_INDEX_URL', 'PERL5OPT', 'PERL5LIB',
    'PERLLIB', 'RUBYOPT', 'RUBYLIB', 'GEM_HOME', 'GEM_PATH', 'BUNDLE_GEMFILE', 'JAVA_TOOL_OPTIONS', 'JDK_JAVA_OPTIONS', 'CLASSPATH', 'GOFLAGS',
    'GOPROXY', 'GOTOOLCHAIN', 'CARGO_HOME', 'RUSTC_WRAPPER', 'CC', 'LD', 'MAKEFLAGS',
    // commands other programs run
    'EDITOR', 'VISUAL', 'PAGER', 'BROWSER', 'LESSOPEN', 'LESSCLOSE', 'MANPAGER', 'GH_PAGER', 'GH_EDITOR', 'GH_BROWSER', 'SUDO_ASKPASS',
    'KUBECTL_EXTERNAL_DIFF_COMMAND', 'FOO_COMMAND', 'FOO_CMD', 'FOO_OPTIONS', 'FOO_OPTS', 'FOO_FLAGS', 'FOO_HOOK', 'FOO_PROGRAM', 'FOO_SHELL', 'FOO_BIN',
    // git and ssh, all of them
    'GIT_CONFIG_KEY_0', 'GIT_CONFIG_VALUE_0', 'GIT_CONFIG_COUNT', 'GIT_CONFIG_PARAMETERS', 'GIT_SSH', 'GIT_SSH_COMMAND', 'GIT_EXEC_PATH', 'GIT_ASKPASS',
    'GIT_EDITOR', 'GIT_PAGER', 'GIT_DIR', 'GIT_TRACE', 'GIT_SSL_CAINFO', 'GIT_PROXY_COMMAND', 'SSH_AUTH_SOCK', 'SSH_ASKPASS',
    // configuration and files
    'XDG_CONFIG_HOME', 'XDG_RUNTIME_DIR', 'KUBECONFIG', 'DOCKER_CONFIG', 'DOCKER_HOST', 'AWS_CONFIG_FILE', 'AWS_SHARED_CREDENTIALS_FILE', 'GH_CONFIG_DIR',
    'GNUPGHOME', 'OPENSSL_CONF', 'CURLRC', 'WGETRC', 'FOO_RC', 'FOO_HOME', 'FOO_DIR', 'FOO_FILE', 'FOO_PATH', 'FOO_ROOT', 'KRB5CCNAME', 'DBUS_SESSION_BUS_ADDRESS',
    // proxies and trust: TLS mode's, set by the shim itself
    'HTTPS_PROXY', 'HTTP_PROXY', 'ALL_PROXY', 'NO_PROXY', 'FTP_PROXY', 'FOO_PROXY_URL', 'SSL_CERT_FILE', 'SSL_CERT_DIR', 'SSLKEYLOGFILE', 'REQUESTS_CA_BUNDLE',
    'CURL_CA_BUNDLE', 'AWS_CA_BUNDLE', 'FOO_CA_BUNDLE', 'FOO_CA_CERT', 'FOO_CAINFO', 'FOO_TLS_INSECURE', 'FOO_INSECURE', 'FOO_VERIFY_SSL', 'FOO_SKIP_VERIFY',
  ];
  for (const name of denied) t.match(envNameProblem(name), new RegExp(`"${name}" is not allowed: `), `${name}: denied, with the reason`);
});

t.test('every deny pattern refuses at least one name the allow rule passes (none is dead)', async (t) => {
  const probes: Record<string, string> = {};
  for (const d of DENIED_ENV) {
    const hit = ['__AC_X', 'PATH', 'BASH_ENV', 'LD_PRELOAD', 'LANG', 'NODE_OPTIONS', 'PYTHONPATH', 'PERL5OPT', 'JAVA_TOOL_OPTIONS', 'GOFLAGS', 'GIT_SSH', 'EDITOR', 'FOO_COMMAND', 'FOO_HOME', 'KUBECONFIG', 'HTTPS_PROXY', 'SSL_CERT_FILE'].find((n) =>
      d.pattern.test(n),
    );
    probes[String(d.pattern)] = hit ?? '';
  }
  t.same(Object.entries(probes).filter(([, hit]) => hit === ''), [], 'each pattern matched a probe');
});

t.test('docs/shims.md lists every denied command and every env rule', async (t) => {
  const doc = readFileSync(resolve(REPO_ROOT, 'docs/shims.md'), 'utf8');
  for (const { group, names } of DENIED_COMMAND_GROUPS) {
    t.ok(doc.includes(group), `group ${group}`);
    for (const n of names) t.ok(doc.includes(`\`${n}\``), `command ${n}`);
  }
  for (const d of DENIED_ENV) t.ok(doc.includes(d.why), `env rule: ${d.why}`);
});

const provider = (commands: unknown[], inject: unknown = { type: 'header', name: 'Authorization', value: 'Bearer {token}' }) => ({
  upstream: 'https://api.example.com',
  tokenFile: '/var/lib/agent-connectors/cli-proxy/p.token',
  inject,
  commands,
});

t.test('the catalog schema holds the rules (providers.json and the desired state alike)', async (t) => {
  const cases: Array<[string, unknown, RegExp]> = [
    ['the attack on `real`', [{ name: 'tool', env: { real: '/usr/bin/id' } }], /env.*upper case/],
    ['git config through the environment', [{ name: 'git', env: { GIT_CONFIG_KEY_0: 'core.fsmonitor', GIT_CONFIG_VALUE_0: 'id', GIT_CONFIG_COUNT: '1' } }], /"GIT_CONFIG_KEY_0" is not allowed/],
    ['LD_PRELOAD', [{ name: 'tool', env: { LD_PRELOAD: '/tmp/x.so' } }], /"LD_PRELOAD" is not allowed/],
    ['a dot-named command', [{ name: '.profile', env: {} }], /plain file name/],
    ['a command starting with -', [{ name: '-i', env: {} }], /plain file name/],
    ['LF in an env value', [{ name: 'tool', env: { TOOL_URL: 'x\nid' } }], /CR, LF or NUL/],
    ['CR in an env value', [{ name: 'tool', env: { TOOL_URL: 'x\rid' } }], /CR, LF or NUL/],
    ['NUL in an env value', [{ name: 'tool', env: { TOOL_URL: 'x\0id' } }], /CR, LF or NUL/],
  ];
  for (const [what, commands, why] of cases) {
    const catalog = parseCatalog(JSON.stringify({ acme: provider(commands as unknown[]) }));
    t.notOk(catalog.ok, `providers.json: ${what}`);
    if (!catalog.ok) t.match(catalog.error, why, `providers.json: ${what}: the rule`);
    if (!catalog.ok) t.match(catalog.error, /^schema: acme\.commands\.0\./, `providers.json: ${what}: names the provider and the command`);
    const { tokenFile: _, ...p } = provider(commands as unknown[]);
    const state = parseDesiredState(JSON.stringify({ version: 3, bindings: {}, providers: { acme: p } }));
    t.notOk(state.ok, `desired state: ${what}`);
    if (!state.ok) t.match(state.error, /providers\.acme\.commands\.0\./, `desired state: ${what}: names the provider`);
  }
  for (const inject of [
    { type: 'header', name: 'Authorization', value: 'Bearer {token}\r\nX-Evil: 1' },
    { type: 'header', name: 'Authorization', value: 'Bearer {token}\n' },
    { type: 'basic', username: 'u\r\n', password: '{token}' },
    { type: 'basic', username: 'u', password: '{token}\0' },
  ]) {
    const r = parseCatalog(JSON.stringify({ acme: provider([], inject) }));
    t.notOk(r.ok, `inject ${JSON.stringify(inject)}: refused`);
    if (!r.ok) t.match(r.error, /CR, LF or NUL/);
  }
  t.ok(parseCatalog(JSON.stringify({ acme: provider([{ name: 'ls', env: {} }]) })).ok, 'a host tool passes the schema: the operator may allow it (apply and shims install check it)');
});
