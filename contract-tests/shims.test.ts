/**
 * PATH shims as the agent sees them (SPEC §5, issue 4): a fixture CLI and npm itself run
 * through their shims as an unprivileged agent UID, from non-interactive `sh -c` scripts,
 * against the built cli-proxy. The agent user (`ac-agent-test`) is created on first use
 * and left in place afterwards (see test/support/agent-user.ts for why).
 */
import { copyFileSync, chmodSync, chownSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, symlinkSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { asRootWithAgent, killGroup, runAsAgent, snapshotProcsOf, spawnAsAgent, type AgentRunResult, type AgentUser, type ProcSnapshot } from '../test/support/agent-user.js';
import { checkNoLeaks, leakedSecrets, REPO_ROOT, startCli, writeToken, type CliProc } from '../test/support/cli-proc.js';
import { json, MockGateway } from '../test/support/mock-gateway.js';
import { startProxy } from '../test/support/proxy-rig.js';

const FIXTURE = join(REPO_ROOT, 'contract-tests/fixtures/fake-cli.sh');
const FX_TOKEN = `tok-shims-fx-REAL-${process.pid}-7b1d9e`;
const NPM_TOKEN = `tok-shims-npm-REAL-${process.pid}-c40af2`;
const PKG = 'ac-shim-fixture-pkg';
const PKG_VERSION = '4.2.7';
/** Shell metacharacters a catalog value may hold; the shim must export them verbatim. */
const TRICKY_BASE = `it's $(id) \`id\` \${HOME} \\ "q" * ; x`;
/** String.prototype.replace treats these specially in a replacement string. */
const DOLLARS = 'cost $$5, amp $& quote $\' tick $` end';

async function exitOf(proc: CliProc): Promise<number | null> {
  return (await proc.exited).code;
}

await asRootWithAgent(t, 'ac-shims-', main);

async function main(agent: AgentUser, base: string): Promise<void> {
  // Layout: one 0755 root-owned base the agent may traverse (asRootWithAgent); the state dir inside is 0700.
  const state = join(base, 'state');
  mkdirSync(join(state, 'cli-proxy'), { recursive: true, mode: 0o700 });
  chmodSync(state, 0o700);
  chmodSync(join(state, 'cli-proxy'), 0o700);
  const shimDir = join(base, 'shims');
  const shimLink = join(base, 'shims-link');
  const shimDir2 = join(base, 'shims-second');
  const binDir = join(base, 'bin');
  mkdirSync(binDir, { mode: 0o755 });
  chmodSync(binDir, 0o755);
  for (const name of ['fxcli', 'fxquote', 'fxdollar']) {
    copyFileSync(FIXTURE, join(binDir, name));
    chmodSync(join(binDir, name), 0o755);
  }
  const home = join(base, 'home');
  mkdirSync(home, { mode: 0o700 });
  chownSync(home, agent.uid, agent.gid);
  const marker = join(home, 'quoting-broke-out');
  const tricky = `${TRICKY_BASE}'; touch ${marker}; echo '`;
  const npmrc = join(base, 'npmrc');

  const fxTokenFile = join(state, 'cli-proxy', 'fx.token');
  const npmTokenFile = join(state, 'cli-proxy', 'npmreg.token');
  writeToken(fxTokenFile, FX_TOKEN);
  writeToken(npmTokenFile, NPM_TOKEN);

  // The fixture's API: records requests; snapshots what the agent UID's processes hold mid-call.
  const api = await MockGateway.start();
  t.teardown(() => api.close());
  const apiSnapshots: ProcSnapshot[][] = [];
  api.handle((_req, res) => {
    apiSnapshots.push(snapshotProcsOf(agent.uid));
    json(res, 200, { items: ['alpha'] });
  });

  // A loopback npm registry that only answers the real token.
  const registry = await MockGateway.start();
  t.teardown(() => registry.close());
  const registrySnapshots: ProcSnapshot[][] = [];
  let proxyPort = 0;
  registry.handle((req, res) => {
    registrySnapshots.push(snapshotProcsOf(agent.uid));
    if (req.headers.authorization !== `Bearer ${NPM_TOKEN}`) {
      json(res, 401, { error: 'authentication required' });
      return;
    }
    if (req.method !== 'GET' || req.url !== `/${PKG}`) {
      json(res, 404, { error: 'not found' });
      return;
    }
    const time = '2024-01-02T03:04:05.000Z';
    json(res, 200, {
      _id: PKG,
      name: PKG,
      'dist-tags': { latest: PKG_VERSION },
      versions: {
        [PKG_VERSION]: {
          _id: `${PKG}@${PKG_VERSION}`,
          name: PKG,
          version: PKG_VERSION,
          description: 'served by the shims contract test',
          dist: {
            tarball: `http://127.0.0.1:${proxyPort}/p/npmreg/${PKG}/-/${PKG}-${PKG_VERSION}.tgz`,
            shasum: '0000000000000000000000000000000000000000',
          },
        },
      },
      time: { created: time, modified: time, [PKG_VERSION]: time },
    });
  });

  const catalog = {
    fx: {
      upstream: api.url('/api'),
      tokenFile: fxTokenFile,
      inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      commands: [
        { name: 'fxcli', env: { FX_BASE_URL: '{baseUrl}', FX_TOKEN: '{placeholder}' } },
        { name: 'fxquote', env: { FX_TRICKY: tricky } },
        { name: 'fxdollar', env: { FX_DOLLARS: DOLLARS } },
        { name: 'ghostcli', env: {} },
      ],
    },
    npmreg: {
      upstream: `http://127.0.0.1:${registry.port}`,
      tokenFile: npmTokenFile,
      inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
      commands: [
        // npm is a host tool: the operator allows it (below). npm's own settings are
        // lower-case variables, which a catalog may not set: the agent's environment has them.
        { name: 'npm', env: { NPM_TOKEN: '{placeholder}' } },
      ],
    },
  };
  const proxy = await startProxy(t, 'cli-proxy', { stateDir: state, config: catalog });
  proxyPort = proxy.port;
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 2);
  const proxyUrl = proxy.base;
  // npm sends only the placeholder, from the environment the shim gave it.
  writeFileSync(npmrc, `//127.0.0.1:${proxyPort}/p/npmreg/:_authToken=\${NPM_TOKEN}\n`, { mode: 0o644 });
  chmodSync(npmrc, 0o644);

  // The operator's allow file: root's, 0644, naming the one host tool this lab shims.
  const allowedCommands = join(base, 'allowed-commands');
  writeFileSync(allowedCommands, '# the lab registry\nnpm\n', { mode: 0o644 });
  chmodSync(allowedCommands, 0o644);
  for (const dir of [shimDir, shimDir2]) {
    const install = startCli(['shims', 'install', '--dir', dir, '--proxy-url', proxyUrl, '--state-dir', state, '--allowed-commands', allowedCommands]);
    const code = await exitOf(install);
    if (code !== 0) throw new Error(`shims install exited ${code}: ${install.lines.join('\n')}`);
  }
  symlinkSync(shimDir, shimLink);

  const SYS = ['/usr/bin', '/bin'];
  const env = (path: string[], extra: Record<string, string> = {}): Record<string, string> => ({
    PATH: path.join(':'),
    HOME: home,
    LANG: 'C.UTF-8',
    ...extra,
  });
  const std = (extra: Record<string, string> = {}): Record<string, string> => env([shimDir, binDir, ...SYS], extra);
  const leaksIn = (r: AgentRunResult): string[] => leakedSecrets(`${r.stdout}\n${r.stderr}`);
  /** The output after the fixture's first line: argc, argv and whatever it printed next. */
  const body = (r: AgentRunResult): string => r.stdout.slice(r.stdout.indexOf('\n') + 1);
  let placeholder = '';

  t.test('the agent UID cannot read the token files or the state directory', async (t) => {
    t.equal(readFileSync(fxTokenFile, 'utf8'), `${FX_TOKEN}\n`, 'the token file exists (root reads it)');
    for (const file of [fxTokenFile, npmTokenFile]) {
      const r = await runAsAgent(agent, 'cat "$1"', { env: std(), args: [file] });
      t.not(r.code, 0, `cat ${file} fails as the agent`);
      t.match(r.stderr, /Permission denied/, 'with permission denied');
      t.same(leaksIn(r), []);
    }
    const ls = await runAsAgent(agent, 'ls "$1"', { env: std(), args: [join(state, 'cli-proxy')] });
    t.not(ls.code, 0, 'the agent cannot list the cli-proxy state directory');
    const id = await runAsAgent(agent, 'id -u; id -G', { env: std() });
    t.equal(id.stdout, `${agent.uid}\n${agent.gid}\n`, 'commands really run as the agent uid, no extra groups');
  });

  t.test('fixture CLI through its shim: the upstream sees the real token; env, argv and output never hold it', async (t) => {
    const envDump = join(home, 'fxcli.env');
    const before = api.requests.length;
    const r = await runAsAgent(agent, 'fxcli list --json "$1"', {
      env: std({ FX_HTTP_PATH: '/items?q=1', FX_ENV_DUMP: envDump, FX_PRINT_VARS: 'FX_BASE_URL FX_TOKEN' }),
      args: ['notes'],
      cwd: home,
    });
    t.equal(r.code, 0, 'exit 0');
    t.match(r.stdout, /^fake-cli name=fxcli pid=\d+ uid=(\d+)\n/, 'the real fixture ran');
    t.match(r.stdout, `uid=${agent.uid}\n`, 'as the agent uid');
    t.match(r.stdout, `FX_BASE_URL=[${proxyUrl}/p/fx]\n`, '{baseUrl} is the provider path on the proxy');
    t.match(r.stdout, '{"items":["alpha"]}\nhttp=200\n', 'the API answered through the proxy');
    t.equal(api.requests.length, before + 1, 'one upstream call');
    const seen = api.requests[before];
    t.equal(seen?.url, '/api/items?q=1', 'path and query reached the upstream');
    t.equal(seen?.headers.authorization, `Bearer ${FX_TOKEN}`, 'the upstream saw the real token');

    placeholder = /^FX_TOKEN=\[(.*)\]$/m.exec(r.stdout)?.[1] ?? '';
    t.ok(placeholder.length > 0, 'the CLI got a placeholder credential');
    t.not(placeholder, FX_TOKEN);
    t.same(leaksIn(r), [], 'no token in the CLI\'s output (argv is printed there too)');
    const dumped = readFileSync(envDump, 'utf8');
    t.match(dumped, `FX_TOKEN=${placeholder}\n`, 'env dump holds the placeholder');
    t.same(leakedSecrets(dumped), [], 'no token in the CLI\'s environment');
    const callerVars = Object.keys(std({ FX_HTTP_PATH: '', FX_ENV_DUMP: '', FX_PRINT_VARS: '' }));
    const added = [...dumped.matchAll(/^([A-Za-z_][A-Za-z0-9_]*)=/gm)]
      .map((m) => m[1] as string)
      .filter((k) => !callerVars.includes(k) && k !== 'PWD')
      .sort();
    t.same(added, ['FX_BASE_URL', 'FX_TOKEN'], 'the shim adds exactly the catalog\'s variables to the environment');
    const snap = apiSnapshots.at(-1) ?? [];
    t.ok(snap.some((p) => p.environ.includes(`FX_TOKEN=${placeholder}`)), '/proc snapshot during the call saw the CLI');
    t.same(leakedSecrets(snap.map((p) => `${p.cmdline}\n${p.environ}`).join('\n')), [], 'no agent-UID process held the token in argv or env');
    for (const name of readdirSync(shimDir)) {
      t.same(leakedSecrets(readFileSync(join(shimDir, name), 'utf8')), [], `shim ${name} holds no token`);
    }
  });

  t.test('argv arrives byte for byte: spaces, quotes, newlines, $, *, empty strings', async (t) => {
    const args = [
      '',
      'a b',
      '  lead and trail  ',
      "it's",
      'say "hi"',
      'line1\nline2',
      'trailing newline\n',
      'tab\there',
      '$HOME',
      '$(id)',
      '`id`',
      '*',
      '[a]*?',
      '\\n not a newline',
      '-',
      '--flag=x y',
      ';&|<>',
      'unicode 日本語 ✓',
      '',
    ];
    // cwd holds files, so an unquoted * would expand.
    const r = await runAsAgent(agent, 'fxcli "$@"', { env: std(), args, cwd: binDir });
    t.equal(r.code, 0);
    const expected = `argc=${args.length}\n${args.map((a) => `[${a}]\n`).join('')}`;
    t.equal(body(r), expected, 'argv unchanged');
    const literal = await runAsAgent(agent, `fxcli 'a  b' "it's" '' "\\$x" '*'`, { env: std(), cwd: binDir });
    t.equal(body(literal), 'argc=5\n[a  b]\n[it\'s]\n[]\n[$x]\n[*]\n', 'from a script\'s literal words too');
  });

  t.test('stdin, stdout and stderr pass through', async (t) => {
    const big = `first line\n\nthird  line with spaces\t\n${'0123456789abcdef'.repeat(16 * 1024)}\nno trailing newline`;
    const r = await runAsAgent(agent, 'fxcli', { env: std({ FX_STDIN: '1' }), input: big, cwd: home });
    t.equal(r.code, 0);
    t.equal(body(r), `argc=0\nstdin<${big}>\n`, '256 KiB of stdin arrive unchanged');
    t.equal(r.stderr, 'fake-cli stderr line\n', 'stderr passes through, and nothing else is written there');
    const piped = await runAsAgent(agent, "printf 'piped\\nlines\\n' | fxcli 2>/dev/null | tr a-z A-Z", {
      env: std({ FX_STDIN: '1' }),
      cwd: home,
    });
    t.equal(piped.code, 0);
    t.match(piped.stdout, 'STDIN<PIPED\nLINES\n>\n', 'works in a pipeline');
    t.equal(piped.stderr, '', 'stderr redirected by the script');
  });

  t.test('exit codes 0, 1 and 42 pass through', async (t) => {
    for (const code of [0, 1, 42]) {
      const inScript = await runAsAgent(agent, 'fxcli; echo "rc=$?"', { env: std({ FX_EXIT: String(code) }), cwd: home });
      t.equal(inScript.code, 0, 'the calling script keeps running');
      t.match(inScript.stdout, `\nrc=${code}\n`, `the script sees ${code}`);
      const direct = await runAsAgent(agent, 'exec fxcli', { env: std({ FX_EXIT: String(code) }), cwd: home });
      t.equal(direct.code, code, `the process exits ${code}`);
    }
  });

  for (const [sig, trapped, code] of [
    ['SIGTERM', 'trapped TERM', 81],
    ['SIGINT', 'trapped INT', 82],
  ] as const) {
    t.test(`${sig} sent to the shim's pid reaches the real CLI (the shim execs)`, async (t) => {
      const child = spawnAsAgent(agent, 'exec fxcli wait-for-signal', { env: std({ FX_WAIT_SIGNAL: '1' }), cwd: home });
      child.stdin?.end();
      let out = '';
      const ready = new Promise<number>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no ready line; stdout so far: ${out}`)), 5_000);
        child.stdout?.on('data', (c: Buffer) => {
          out += c.toString('utf8');
          const m = /ready pid=(\d+)\n/.exec(out);
          if (m) {
            clearTimeout(timer);
            resolve(Number(m[1]));
          }
        });
      });
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
        child.once('close', (c, s) => r({ code: c, signal: s })),
      );
      t.teardown(() => killGroup(child));
      const fixturePid = await ready;
      t.equal(fixturePid, child.pid, 'the real CLI runs in the shim\'s own process (exec, no fork)');
      // To the shim's pid, as an agent runtime or a user's kill would send it.
      process.kill(child.pid ?? -1, sig);
      // Generous: on a loaded 2-core CI machine the shell and its background sleep are slow to go.
      const timeout = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
        setTimeout(() => r({ code: null, signal: null }), 20_000).unref(),
      );
      const { code: exitCode, signal } = await Promise.race([exited, timeout]);
      t.match(out, `${trapped}\n`, 'the fixture\'s trap saw the signal');
      t.notMatch(out, 'no signal arrived');
      t.same({ code: exitCode, signal }, { code, signal: null }, 'exit status chosen by the fixture\'s trap');
    });
  }

  t.test('no recursion: the real command runs exactly once, whatever the PATH spelling', async (t) => {
    const spellings: Array<[string, string[], string?]> = [
      ['shim dir first, real command later', [shimDir, binDir, ...SYS]],
      ['shim dir twice', [shimDir, shimDir, binDir, ...SYS]],
      ['trailing slash and a symlinked spelling', [`${shimDir}/`, shimLink, shimDir, binDir, ...SYS]],
      ['symlinked spelling first', [shimLink, `${shimDir}/.`, binDir, ...SYS]],
      ['empty PATH entry while cwd is the shim dir', ['', shimDir, binDir, ...SYS], shimDir],
    ];
    for (const [what, path, cwd] of spellings) {
      const count = join(home, `count-${spellings.findIndex((s) => s[0] === what)}`);
      const r = await runAsAgent(agent, 'fxcli once', {
        env: env(path, { FX_COUNT_FILE: count, FX_PRINT_VARS: 'FX_BASE_URL' }),
        cwd: cwd ?? home,
        timeoutMs: 5_000,
      });
      t.equal(r.timedOut, false, `${what}: terminates`);
      t.equal(r.code, 0, `${what}: exit 0`);
      t.equal(existsSync(count) ? readFileSync(count, 'utf8') : '', 'run\n', `${what}: the real command ran once`);
      t.match(r.stdout, `FX_BASE_URL=[${proxyUrl}/p/fx]`, `${what}: through the shim`);
    }
  });

  t.test('no recursion with two shim directories on PATH (e.g. a second install)', async (t) => {
    const count = join(home, 'count-two-dirs');
    const r = await runAsAgent(agent, 'fxcli once', {
      env: env([shimDir, shimDir2, binDir, ...SYS], { FX_COUNT_FILE: count }),
      cwd: home,
      timeoutMs: 3_000,
    });
    t.equal(r.timedOut, false, 'terminates (does not bounce between the two shims forever)');
    t.equal(r.code, 0);
    t.equal(existsSync(count) ? readFileSync(count, 'utf8') : '', 'run\n', 'the real command ran once');
    const ghost = await runAsAgent(agent, 'ghostcli', { env: env([shimDir, shimDir2, ...SYS]), cwd: home, timeoutMs: 3_000 });
    t.equal(ghost.timedOut, false, 'no real command: terminates');
    t.equal(ghost.code, 127, 'no real command: 127');
  });

  t.test('no real command: exit 127 with a message naming the command', async (t) => {
    for (const [name, path] of [
      ['ghostcli', [shimDir, shimLink, shimDir, ...SYS]],
      ['fxcli', [shimDir, ...SYS]],
    ] as const) {
      const r = await runAsAgent(agent, `${name} arg; echo "rc=$?"`, { env: env([...path]), cwd: home, timeoutMs: 5_000 });
      t.equal(r.timedOut, false, `${name}: terminates`);
      t.equal(r.stdout, 'rc=127\n', `${name}: 127`);
      t.match(r.stderr, name, `${name}: stderr names the command`);
      t.match(r.stderr, /not found/i, `${name}: and says it was not found`);
      t.notMatch(r.stderr, /^sh: /, `${name}: the message is the shim's, not the shell's`);
    }
  });

  t.test('catalog env values are exported literally (single-quoted, never executed)', async (t) => {
    const shim = readFileSync(join(shimDir, 'fxquote'), 'utf8');
    t.match(shim, /^ {2}FX_TRICKY='/m, 'rendered single-quoted, as a word for env');
    const r = await runAsAgent(agent, 'fxquote', { env: std({ FX_PRINT_VARS: 'FX_TRICKY' }), cwd: home });
    t.equal(r.code, 0);
    t.equal(body(r), `argc=0\nFX_TRICKY=[${tricky}]\n`, "quotes, $(id), backticks and ${HOME} arrive verbatim");
    t.notOk(existsSync(marker), 'nothing in the value was executed');
  });

  t.test('catalog env values with $$, $&, $\' and $` are exported literally', async (t) => {
    const r = await runAsAgent(agent, 'fxdollar', { env: std({ FX_PRINT_VARS: 'FX_DOLLARS' }), cwd: home });
    t.equal(r.code, 0);
    t.equal(body(r), `argc=0\nFX_DOLLARS=[${DOLLARS}]\n`, 'value verbatim');
  });

  // shims install, on its own catalog and directories.
  const iState = join(base, 'install-state');
  mkdirSync(iState, { mode: 0o700 });
  const iCatalog = join(iState, 'providers.json');
  const provider = (commands: string[]): unknown => ({
    upstream: 'https://api.example.com',
    tokenFile: join(iState, 'p.token'),
    inject: { type: 'header', name: 'Authorization', value: 'Bearer {token}' },
    commands: commands.map((name) => ({ name, env: { X_BASE: '{baseUrl}' } })),
  });
  const install = async (dir: string): Promise<CliProc> => {
    const p = startCli(['shims', 'install', '--dir', dir, '--proxy-url', proxyUrl, '--state-dir', iState, '--providers', iCatalog]);
    await p.exited;
    return p;
  };

  t.test('shims install writes 0755 shims and removes stale ones and dot files, never other foreign files', async (t) => {
    const dir = join(base, 'install', 'shims');
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    chmodSync(join(base, 'install'), 0o755);
    chmodSync(dir, 0o755);
    writeFileSync(iCatalog, JSON.stringify({ prov1: provider(['alpha', 'beta']), prov2: provider(['gamma']) }));
    const first = await install(dir);
    t.equal(first.child.exitCode, 0, 'first install exit 0');
    for (const name of ['alpha', 'beta', 'gamma']) {
      const st = lstatSync(join(dir, name));
      t.ok(st.isFile(), `${name} is a regular file`);
      t.equal(st.mode & 0o7777, 0o755, `${name} is 0755`);
    }
    chmodSync(join(dir, 'alpha'), 0o700);

    // Foreign files of every kind.
    writeFileSync(join(dir, 'foreign-tool'), '#!/bin/sh\necho foreign\n', { mode: 0o700 });
    writeFileSync(join(dir, 'notes.txt'), 'operator notes about agent-connectors shims\n', { mode: 0o640 });
    writeFileSync(join(dir, '.hidden'), 'dotfile\n', { mode: 0o600 });
    mkdirSync(join(dir, 'subdir'), { mode: 0o750 });
    writeFileSync(join(dir, 'subdir', 'inner'), 'inner\n', { mode: 0o644 });
    symlinkSync('/etc/hostname', join(dir, 'outside-link'));
    const foreign = ['foreign-tool', 'notes.txt', 'subdir', 'subdir/inner', 'outside-link'];
    const fingerprint = (rel: string): string => {
      const p = join(dir, rel);
      const st = lstatSync(p);
      const content = st.isSymbolicLink() ? `-> ${readlinkSync(p)}` : st.isDirectory() ? readdirSync(p).join(',') : readFileSync(p, 'utf8');
      return JSON.stringify({ ino: st.ino, mode: st.mode, mtime: st.mtimeMs, uid: st.uid, content });
    };
    const before = Object.fromEntries(foreign.map((f) => [f, fingerprint(f)]));

    writeFileSync(iCatalog, JSON.stringify({ prov1: provider(['alpha']) }));
    const second = await install(dir);
    t.equal(second.child.exitCode, 0, 'second install exit 0');
    t.notOk(existsSync(join(dir, 'beta')), 'beta (command dropped) removed');
    t.notOk(existsSync(join(dir, 'gamma')), 'gamma (provider dropped) removed');
    const out = second.lines.join('\n');
    t.match(out, 'beta', 'output names the removed shims');
    t.match(out, 'gamma');
    t.notOk(existsSync(join(dir, '.hidden')), 'a dot file is removed (no command is a dot name; `. name` would source it)');
    t.equal(statSync(join(dir, 'alpha')).mode & 0o7777, 0o755, 'alpha rewritten with 0755');
    for (const f of foreign) t.equal(fingerprint(f), before[f], `foreign ${f} untouched`);
    t.same(
      readdirSync(dir).filter((n) => n.endsWith('.tmp')),
      [],
      'no temp files left behind',
    );
  });

  t.test('shims install leaves a foreign symlink alone even when it points at one of our shims', async (t) => {
    const dir = join(base, 'install-alias', 'shims');
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    writeFileSync(iCatalog, JSON.stringify({ prov1: provider(['alpha']) }));
    t.equal((await install(dir)).child.exitCode, 0);
    symlinkSync('alpha', join(dir, 'alpha-alias')); // an operator's own alias
    t.equal((await install(dir)).child.exitCode, 0);
    t.ok(lstatSync(join(dir, 'alpha-alias'), { throwIfNoEntry: false })?.isSymbolicLink(), 'the operator\'s symlink survives');
  });

  t.test('shims install creates a missing shim dir 0755 even under umask 077', async (t) => {
    const parent = join(base, 'install-fresh');
    mkdirSync(parent, { mode: 0o755 });
    chmodSync(parent, 0o755);
    const dir = join(parent, 'shims');
    writeFileSync(iCatalog, JSON.stringify({ prov1: provider(['alpha']) }));
    const old = process.umask(0o077);
    let p: CliProc;
    try {
      p = startCli(['shims', 'install', '--dir', dir, '--proxy-url', proxyUrl, '--state-dir', iState, '--providers', iCatalog]);
    } finally {
      process.umask(old);
    }
    await p.exited;
    t.equal(p.child.exitCode, 0);
    t.equal(statSync(join(dir, 'alpha')).mode & 0o7777, 0o755, 'shim 0755 despite the umask');
    t.equal(statSync(dir).mode & 0o7777, 0o755, 'shim dir 0755 (SPEC §2), so the agent UID can use it');
    const r = await runAsAgent(agent, '"$1" x', { env: env(SYS), args: [join(dir, 'alpha')], cwd: home });
    t.equal(r.code, 127, 'the agent can run the shim (no real alpha → 127 from the shim)');
    t.notMatch(r.stderr, /Permission denied/);
  });

  t.test('npm through its shim as the agent UID: the registry saw the real token, npm never held it', async (t) => {
    const before = registry.requests.length;
    const r = await runAsAgent(agent, 'npm view "$1" version --no-update-notifier', {
      env: env([shimDir, ...SYS], {
        npm_config_registry: `${proxyUrl}/p/npmreg/`,
        npm_config_userconfig: npmrc,
        npm_config_update_notifier: 'false',
        npm_config_cache: join(home, '.npm-cache'),
        npm_config_audit: 'false',
        npm_config_fund: 'false',
      }),
      args: [PKG],
      cwd: home,
      timeoutMs: 30_000,
    });
    t.equal(r.timedOut, false);
    t.equal(r.code, 0, `npm view exits 0 (stderr: ${r.stderr.slice(0, 500)})`);
    t.equal(r.stdout.trim(), PKG_VERSION, 'npm printed the version the registry served');
    const seen = registry.requests.slice(before);
    t.ok(seen.some((q) => q.url === `/${PKG}`), 'npm asked the loopback registry, through the proxy');
    t.same(
      seen.map((q) => q.headers.authorization),
      seen.map(() => `Bearer ${NPM_TOKEN}`),
      'every registry request carried the real token, injected by the proxy (not npm\'s placeholder)',
    );
    t.same(leaksIn(r), [], 'npm\'s output holds no token');

    const snaps = registrySnapshots.slice(-seen.length).flat();
    const npmProc = snaps.find((p) => /npm/.test(p.cmdline) && p.environ.includes('NPM_TOKEN='));
    t.ok(npmProc, 'the /proc snapshot taken during the request saw npm');
    if (placeholder) t.match(npmProc?.environ ?? '', `NPM_TOKEN=${placeholder}\n`, 'npm held only the placeholder');
    t.match(npmProc?.cmdline ?? '', `view ${PKG} version`, 'npm\'s argv as given');
    t.same(leakedSecrets(snaps.map((p) => `${p.cmdline}\n${p.environ}`).join('\n')), [], 'no agent-UID process held the token');

    // Everything npm wrote (cache, logs) as the agent.
    let files = 0;
    const leaks: string[] = [];
    const walk = (dir: string): void => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        const p = join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (e.isFile()) {
          files++;
          if (leakedSecrets(readFileSync(p, 'latin1')).length) leaks.push(p);
        }
      }
    };
    walk(home);
    t.ok(files > 0, 'npm wrote files under the agent\'s HOME');
    t.same(leaks, [], 'none of them holds the token');
  });

  t.test('shims path --agent prints how to put the shim dir first on the agent\'s PATH', async (t) => {
    const run = async (args: string[]): Promise<CliProc> => {
      const p = startCli(['shims', 'path', ...args]);
      await p.exited;
      return p;
    };
    const oc = await run(['--agent', 'openclaw', '--dir', shimDir]);
    t.equal(oc.child.exitCode, 0);
    t.equal(oc.lines[0], `openclaw config set tools.exec.pathPrepend ${shimDir}`, 'openclaw: its official config command');
    // Issue 20 item 5: what OpenClaw's sandbox means for the shims; SPEC §10: where TLS
    // mode's trust lives. Shell comments, so the output stays runnable.
    t.ok(oc.lines.slice(1).every((l) => l.startsWith('# ')), 'every further line is a comment');
    t.match(oc.lines.join('\n'), /agents\.defaults\.sandbox\.mode/, 'openclaw: says its sandbox\'s container cannot reach the host\'s cli-proxy');
    t.match(oc.lines.at(-1), /^# TLS mode: the CLI CA's certificate \/\S+\/cli-ca\/ca-cert\.pem \(its key \/\S+\/cli-ca\/ca\.pem: .*the shims' CA bundle \/\S+\/ca-bundle\.pem$/, 'then where the CLI CA and the bundle are');
    for (const agentName of ['claude', 'codex']) {
      const p = await run(['--agent', agentName, '--dir', shimDir]);
      t.equal(p.child.exitCode, 0);
      const text = p.lines.join('\n');
      t.match(p.lines[0], `PATH=${shimDir}:$PATH ${agentName}`, `${agentName}: shim dir first on PATH, then the agent`);
      t.ok(p.lines.slice(1).every((l) => l.startsWith('# ')), `${agentName}: every further line is a comment`);
      t.match(text, /sandbox/, `${agentName}: says what its sandbox needs`);
    }
    // Codex's sandbox turns the network off: its line carries both overrides that open it
    // (release gate codex-sandbox runs a shim through \`codex sandbox\` with exactly these).
    const codex = await run(['--agent', 'codex', '--dir', shimDir]);
    t.match(codex.lines[0], ` codex -c 'sandbox_mode="workspace-write"' -c 'sandbox_workspace_write.network_access=true' `, 'codex: the sandbox overrides, shell-quoted');
    const claude = await run(['--agent', 'claude', '--dir', shimDir]);
    t.match(claude.lines.join('\n'), /sandbox\.excludedCommands/, 'claude: what to set if its sandbox is on');
    const bad = await run(['--agent', 'nope', '--dir', shimDir]);
    t.equal(bad.child.exitCode, 2, 'unknown agent: usage error, exit 2');
    const missing = await run(['--dir', shimDir]);
    t.equal(missing.child.exitCode, 2, 'no --agent: usage error, exit 2');
  });

  checkNoLeaks(t);
}
