/**
 * What a catalog may not do (SPEC §10, last item; issue 21 item 1). A Gateway's catalog is
 * data, not code: it names CLIs the agent already has and hands them a base URL and a
 * placeholder. Everything here is data plus one predicate per kind, so docs/shims.md can
 * list the rules and test/data/catalog-rules.test.ts can check them name by name.
 *
 *   - command names: a plain file name, and none of the host's own tools (an operator
 *     may allow one of those in /etc/agent-connectors/allowed-commands; a Gateway never);
 *   - environment names: an allow rule (an upper-case POSIX name) minus every name that
 *     changes how a program loads or runs, where it reads its configuration, whom it
 *     trusts or which proxy it uses;
 *   - values (env values, inject templates): no CR, LF or NUL.
 */

/** A plain file name: no path, no dot file (`. name` sources it from PATH), no option look-alike. */
export const COMMAND_NAME = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$/;
export const COMMAND_NAME_RULE = 'command name must be a plain file name: [A-Za-z0-9._-], not starting with . or -, at most 64 characters';

/**
 * The host's own tools, by group. A shim by one of these names would stand in front of
 * the real tool for every agent (and every script the agent runs): `ls` running `id`, a
 * `sudo` with a chosen environment. `*` at the end matches any suffix (`python3.12`).
 * `git` is not here on purpose: agents use it with a provider (its environment is held
 * by the env rule below, which denies every GIT_* name).
 */
export const DENIED_COMMAND_GROUPS: ReadonlyArray<{ group: string; names: readonly string[] }> = [
  { group: 'shells', names: ['sh', 'bash', 'rbash', 'dash', 'ash', 'zsh', 'fish', 'ksh', 'mksh', 'pdksh', 'csh', 'tcsh', 'yash', 'busybox', 'pwsh'] },
  {
    group: 'coreutils',
    names: [
      'arch', 'b2sum', 'base32', 'base64', 'basename', 'basenc', 'cat', 'chcon', 'chgrp', 'chmod', 'chown', 'chroot', 'cksum', 'comm', 'coreutils',
      'cp', 'csplit', 'cut', 'date', 'dd', 'df', 'dir', 'dircolors', 'dirname', 'du', 'echo', 'env', 'expand', 'expr', 'factor', 'false', 'fmt',
      'fold', 'groups', 'head', 'hostid', 'hostname', 'id', 'install', 'join', 'kill', 'link', 'ln', 'logname', 'ls', 'md5sum', 'mkdir', 'mkfifo',
      'mknod', 'mktemp', 'mv', 'nice', 'nl', 'nohup', 'nproc', 'numfmt', 'od', 'paste', 'pathchk', 'pinky', 'pr', 'printenv', 'printf', 'ptx',
      'pwd', 'readlink', 'realpath', 'rm', 'rmdir', 'runcon', 'seq', 'sha1sum', 'sha224sum', 'sha256sum', 'sha384sum', 'sha512sum', 'shred',
      'shuf', 'sleep', 'sort', 'split', 'stat', 'stdbuf', 'stty', 'sum', 'sync', 'tac', 'tail', 'tee', 'test', 'timeout', 'touch', 'tr', 'true',
      'truncate', 'tsort', 'tty', 'uname', 'unexpand', 'uniq', 'unlink', 'uptime', 'users', 'vdir', 'wc', 'who', 'whoami', 'yes',
    ],
  },
  {
    group: 'util-linux, findutils, grep, sed, awk, archivers, procps',
    names: [
      'mount', 'umount', 'login', 'nologin', 'sulogin', 'agetty', 'getty', 'more', 'less', 'flock', 'getopt', 'logger', 'script', 'setsid',
      'taskset', 'unshare', 'nsenter', 'chrt', 'ionice', 'renice', 'prlimit', 'setarch', 'pivot_root', 'switch_root', 'whereis', 'which',
      'find', 'xargs', 'locate', 'updatedb', 'grep', 'egrep', 'fgrep', 'sed', 'awk', 'gawk', 'mawk', 'nawk', 'tar', 'cpio', 'gzip', 'gunzip',
      'zcat', 'bzip2', 'bunzip2', 'xz', 'unxz', 'zstd', 'unzip', 'zip', 'diff', 'cmp', 'patch', 'file', 'ps', 'top', 'pgrep', 'pkill',
      'killall', 'watch', 'strace', 'ltrace', 'gdb', 'ldd', 'ldconfig', 'ld.so', 'vi', 'vim', 'nano', 'ed', 'man', 'make', 'curl', 'wget',
      'ip', 'ss', 'openssl', 'gpg',
    ],
  },
  { group: 'privilege', names: ['sudo', 'sudoedit', 'visudo', 'su', 'doas', 'pkexec', 'runuser', 'setpriv', 'capsh', 'newgrp', 'sg'] },
  { group: 'process wrappers', names: ['env', 'nohup', 'timeout', 'nice', 'xargs', 'stdbuf', 'exec', 'command', 'builtin'] },
  {
    group: 'interpreters',
    names: ['python*', 'perl*', 'ruby*', 'irb', 'node', 'nodejs', 'deno', 'bun', 'php*', 'lua*', 'luajit', 'tclsh*', 'wish', 'java', 'jshell', 'Rscript', 'osascript'],
  },
  {
    group: 'package managers',
    names: ['apt', 'apt-get', 'apt-cache', 'dpkg*', 'snap', 'flatpak', 'pip*', 'pipx', 'uv', 'uvx', 'npm', 'npx', 'yarn', 'pnpm', 'corepack', 'gem', 'bundle', 'cargo', 'rustup', 'yum', 'dnf', 'rpm', 'zypper', 'apk', 'pacman', 'brew', 'nix', 'conda'],
  },
  { group: 'remote access', names: ['ssh', 'scp', 'sftp', 'ssh-agent', 'ssh-add', 'ssh-keygen', 'rsync'] },
  { group: 'services and scheduling', names: ['systemctl', 'journalctl', 'loginctl', 'systemd-run', 'crontab', 'at', 'batch'] },
  { group: 'accounts', names: ['passwd', 'chpasswd', 'chsh', 'chfn', 'chage', 'gpasswd', 'useradd', 'usermod', 'userdel', 'groupadd', 'groupmod', 'groupdel', 'adduser', 'deluser'] },
  { group: 'this product', names: ['agent-connectors'] },
];

/** Why `name` is one of the host's own tools (its group), or undefined. */
export function hostToolGroup(name: string): string | undefined {
  for (const { group, names } of DENIED_COMMAND_GROUPS) {
    for (const n of names) {
      if (n.endsWith('*') ? name.startsWith(n.slice(0, -1)) : name === n) return group;
    }
  }
  return undefined;
}

/**
 * Why a catalog may not name this command, or undefined. `allowed`: the names the
 * operator allowed in /etc/agent-connectors/allowed-commands (never the Gateway).
 */
export function commandNameProblem(name: string, allowed: ReadonlySet<string> = new Set()): string | undefined {
  if (!COMMAND_NAME.test(name)) return COMMAND_NAME_RULE;
  const group = hostToolGroup(name);
  if (group !== undefined && !allowed.has(name)) {
    return `command "${name}" is one of the host's own tools (${group}); only the operator may allow it, in the allowed-commands file`;
  }
  return undefined;
}

/** The allow rule: an upper-case POSIX name. Lower case is left to the agent (`http_proxy`, `npm_config_*`). */
export const ENV_NAME = /^[A-Z][A-Z0-9_]{0,127}$/;
export const ENV_NAME_RULE = 'environment name must be upper case: [A-Z][A-Z0-9_]*, at most 128 characters';

/**
 * The shim's own shell variables start with this (shims/shim.sh.in). No catalog name can
 * (the allow rule has no leading `_`); listed too so the reason is plain if the rule changes.
 */
export const SHIM_INTERNAL_PREFIX = '__ac_';

/**
 * Names the allow rule would pass but a catalog may not set, each with why. Patterns are
 * anchored regular expressions over the whole name.
 */
export const DENIED_ENV: ReadonlyArray<{ pattern: RegExp; why: string }> = [
  { pattern: /^__AC_/i, why: "the shim's own variables" },
  // The shell and the login.
  { pattern: /^(PATH|IFS|ENV|CDPATH|PS[1-4]|PROMPT_COMMAND|HOME|SHELL|SHLVL|USER|LOGNAME|MAIL|MAILPATH|PWD|OLDPWD|TMPDIR|TMP|TEMP|TERM|INPUTRC|ZDOTDIR|FPATH|GLOBIGNORE|SHELLOPTS|BASHOPTS|POSIXLY_CORRECT)$/, why: 'the shell and the login session' },
  { pattern: /^(BASH|ZSH|KSH)|^HIST[A-Z]*$/, why: 'shell start-up and history' },
  // The dynamic loader and libc.
  { pattern: /^(LD_|MALLOC_|GLIBC_|GCONV_|GMON_|LOCPATH$|NLSPATH$|HOSTALIASES$|RESOLV_|RES_OPTIONS$|LOCALDOMAIN$|TZ$|TZDIR$|TERMINFO)/, why: 'the dynamic loader and libc' },
  { pattern: /^(LANG|LANGUAGE|LC_[A-Z_]+)$/, why: 'the locale (the agent keeps its own)' },
  // Runtimes and their package managers: each reads code, options or modules from its variables.
  { pattern: /^(NODE_|NPM_CONFIG|YARN_|PNPM_|COREPACK_|BUN_|DENO_)/, why: 'the JavaScript runtimes' },
  { pattern: /^(PYTHON|PIP_|UV_|CONDA|VIRTUAL_ENV)/, why: 'Python' },
  { pattern: /^(PERL|RUBY|GEM_|BUNDLE_|LUA_|PHP)/, why: 'Perl, Ruby, Lua, PHP' },
  { pattern: /^(JAVA_|JDK_|CLASSPATH$|MAVEN_|GRADLE_)/, why: 'Java' },
  { pattern: /^(GO[A-Z0-9]*|CGO_[A-Z0-9_]*|CARGO_[A-Z0-9_]*|RUST[A-Z0-9_]*|CC|CXX|CPP|LD|AR|MAKE[A-Z0-9_]*)$/, why: 'build toolchains' },
  // Tools whose variables are code or commands.
  { pattern: /^(GIT_|SSH_|GPG_|GNUPG|SUDO_|DOCKER_|KUBE|KRB5|DBUS_|SYSTEMD_|XDG_|DISPLAY$|XAUTHORITY$|WAYLAND_)/, why: 'tools that run commands or find credentials from their variables' },
  { pattern: /^(EDITOR|VISUAL|PAGER|BROWSER|LESS[A-Z0-9_]*|MANPAGER|MANOPT)$/, why: 'commands run by other programs' },
  {
    pattern: /_(OPTIONS|OPTS|OPT|FLAGS|COMMAND|CMD|EDITOR|PAGER|BROWSER|ASKPASS|PROGRAM|EXEC|EXE|BIN|BINARY|SHELL|WRAPPER|HOOK|HOOKS|PLUGIN|PLUGINS|SCRIPT|INTERPRETER|PRELOAD)$/,
    why: 'a command, option string or program the tool runs',
  },
  { pattern: /(PATH|_LIB|LIB|_HOME|HOME|_DIR|_DIRS|DIR|_FILE|_ROOT)$/, why: 'where a program finds code, configuration or files' },
  { pattern: /(CONFIG|(^|_)CONF(_|$)|RC$)/, why: 'where a program reads its configuration' },
  // Trust and proxies belong to TLS mode, which the shim sets itself (SPEC §10).
  { pattern: /(^|_)PROXY(_|$)/, why: "proxies (the shim's own, in TLS mode)" },
  { pattern: /^(SSL|OPENSSL|CURL_CA|REQUESTS_CA)|(^|_)CA(_BUNDLE|_CERTS?|_FILE|_PATH|INFO|PATH|CERT)?$|_CA_BUNDLE$|_CA_CERTS?$|(^|_)CERTS?(_|$)|(^|_)TLS(_|$)|INSECURE|VERIFY|KEYLOG/, why: 'TLS trust and verification' },
];

/** Why a catalog may not set this environment variable, or undefined. */
export function envNameProblem(name: string): string | undefined {
  if (name.startsWith(SHIM_INTERNAL_PREFIX)) return `environment name starts with ${SHIM_INTERNAL_PREFIX}: the shim's own variables`;
  if (!ENV_NAME.test(name)) return ENV_NAME_RULE;
  const denied = DENIED_ENV.find((d) => d.pattern.test(name));
  return denied && `environment name "${name}" is not allowed: ${denied.why}`;
}

/** CR or LF splits a header or a script line; NUL ends a C string early. None belongs in a catalog value. */
export const LINE_BREAK_OR_NUL = /[\r\n\0]/;
export const NO_LINE_BREAK_RULE = 'must not contain CR, LF or NUL';

/**
 * The first command a catalog names that is one of the host's own tools and not allowed
 * by the operator, as `<provider>.<command>: why`, or undefined. The name syntax and the
 * env rules are in the schemas; this part needs the operator's allow file, which only
 * apply and `shims install` read.
 */
export function hostToolProblem(
  providers: Record<string, { commands: ReadonlyArray<{ name: string }> }>,
  allowed: ReadonlySet<string>,
): string | undefined {
  for (const [provider, p] of Object.entries(providers)) {
    for (const [i, c] of p.commands.entries()) {
      const problem = commandNameProblem(c.name, allowed);
      if (problem !== undefined) return `providers.${provider}.commands.${i}.name: ${problem}`;
    }
  }
  return undefined;
}
