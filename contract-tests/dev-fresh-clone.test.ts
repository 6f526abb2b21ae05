import { execFileSync, spawn } from 'node:child_process';
import { cpSync, existsSync, lstatSync, mkdirSync, readFileSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { allProcs, checkNoLeaks, CliProc, knownSecrets, REPO_ROOT } from '../test/support/cli-proc.js';
import { eventually, until } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import { unlessMissing } from '../test/tools/prerequisite.js';

/*
 * The first thing a newcomer runs, exactly as the README prints it: `npm run dev` in a
 * fresh clone, default options (state in ./.state, inside the clone, which is also the
 * package root), then the commands dev itself prints. The other dev tests give
 * --state-dir elsewhere and kernel-picked ports, which is how the default once broke
 * unnoticed (issue 19, defect 1: no shim was written under ./.state/shims).
 */

/** dev's default addresses (forwarder, cli-proxy, metrics): the test checks dev prints them. */
const DEFAULT_PORTS = [14323, 14324, 14325] as const;

/** How long a connect or disconnect may take to show on the host (issue 19). */
const FOLLOW_MS = 2_000;

/** A port another process holds (dev could not start with its defaults). */
async function portHeld(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(true));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(false)));
  });
}

/**
 * A clone as a user gets one: the files git tracks, as they are in the working tree (no
 * .state, dist, build or anything else of this checkout's), node_modules linked (for
 * `npm ci`) and dist copied (for the build `npm ci` runs through `prepare`).
 */
function freshClone(t: TapTest): string {
  const dir = tempDir('ac-clone-', t);
  const tracked = execFileSync('git', ['ls-files', '-z'], { cwd: REPO_ROOT, encoding: 'utf8' }).split('\0').filter(Boolean);
  for (const file of tracked) {
    const from = join(REPO_ROOT, file);
    if (!lstatSync(from, { throwIfNoEntry: false })) continue; // deleted in the working tree
    mkdirSync(dirname(join(dir, file)), { recursive: true });
    cpSync(from, join(dir, file), { verbatimSymlinks: true });
  }
  symlinkSync(join(REPO_ROOT, 'node_modules'), join(dir, 'node_modules'));
  cpSync(join(REPO_ROOT, 'dist'), join(dir, 'dist'), { recursive: true, verbatimSymlinks: true });
  return dir;
}

/** A user's shell: none of tap's loaders, npm's lifecycle variables or a NOTIFY_SOCKET. */
function userEnv(): NodeJS.ProcessEnv {
  return Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !/^(NODE_OPTIONS|NOTIFY_SOCKET|TAP|_TAP|npm_)/i.test(k)),
  );
}

/** A command line run in the user's shell, in the clone, in a process group of its own (for Ctrl-C). */
function shell(line: string, cwd: string): CliProc {
  const child = spawn('sh', ['-c', line], { cwd, env: userEnv(), detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  const proc = new CliProc(child);
  allProcs.push(proc);
  return proc;
}

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

/** What the forwarder answers for a binding URL: its own 404 when it does not serve it. */
async function served(url: string): Promise<boolean> {
  const res = await request(url, { headers: { accept: 'application/json, text/event-stream' } }).catch(() => undefined);
  if (!res) return false;
  const text = await res.body.text();
  if (res.statusCode === 404 && text.includes('unknown_binding')) return false;
  return !(res.statusCode === 503 && text.includes('token_unavailable'));
}

async function gone(url: string): Promise<boolean> {
  const res = await request(url, { headers: { accept: 'application/json, text/event-stream' } });
  const text = await res.body.text();
  return res.statusCode === 404 && text.includes('unknown_binding');
}

/**
 * Runs a control command as dev printed it and measures, independently of its own report,
 * how long the host takes to show the change through the forwarder at `url`: from the
 * command's word that the platform has changed the desired state (npm's and node's start
 * before it are the command's, not the host's) to the forwarder's answer changing.
 */
async function follow(t: TapTest, line: string, cwd: string, url: string, shown: (url: string) => Promise<boolean>): Promise<void> {
  const proc = shell(line, cwd);
  await proc.waitForLog((l) => / in the demo platform \(desired state version \d+\)$/.test(l.msg ?? ''), 30_000);
  const changed = performance.now();
  const seen = await eventually(() => shown(url), 15_000);
  const ms = Math.round(performance.now() - changed);
  const exit = await proc.exited;
  const said = proc.lines.join(' | ');
  t.ok(seen, `${line}: the forwarder shows it`);
  t.equal(exit.code, 0, `${line} exits 0`);
  t.ok(proc.lines.some((l) => / after \d+ ms/.test(l)), `${line}: its own wait succeeded`);
  t.ok(ms <= FOLLOW_MS, `${line}: followed by the host within ${FOLLOW_MS} ms (${ms} ms; the command said: ${said})`);
}

const held: number[] = [];
for (const port of DEFAULT_PORTS) if (await portHeld(port)) held.push(port);
const noGit = existsSync(join(REPO_ROOT, '.git')) ? undefined : `${REPO_ROOT} is not a git checkout (the clone is made from git ls-files)`;
const needs = { skip: unlessMissing(t, noGit ?? (held.length > 0 && `dev's default ports ${held.join(', ')} are held by another process`)) };

t.test('npm run dev from a fresh clone, as the README says: the shim demo answers, connect and disconnect follow', needs, async (t) => {
  // The README's own command (after `npm ci &&`, which node_modules and dist stand in for).
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const first = readme.split('\n').find((l) => l.startsWith('npm ci && npm run dev')) ?? '';
  const devCommand = first.split('#')[0]?.split('&&').map((s) => s.trim()).find((s) => s.startsWith('npm run dev')) ?? '';
  t.equal(devCommand, 'npm run dev', 'the README says: npm ci && npm run dev');

  const clone = freshClone(t);
  const dev = shell(devCommand, clone);
  const pgid = dev.child.pid as number;
  t.teardown(async () => {
    if (groupAlive(pgid)) process.kill(-pgid, 'SIGKILL');
    await dev.exited;
  });
  await dev.waitForStderr(/agent-connectors dev is running/, 60_000);
  const state = (await dev.waitForStderr(/^\s+state:\s+(\S+)$/))[1];
  t.equal(state, join(clone, '.state'), 'state in ./.state of the clone');
  const mcp = (await dev.waitForStderr(/MCP URL:\s+(\S+)/))[1] as string;
  t.match(mcp, new RegExp(`^http://127\\.0\\.0\\.1:${DEFAULT_PORTS[0]}/i/demo_`), "the forwarder on its default address");
  t.match((await dev.waitForStderr(/metrics:\s+(\S+)/))[1], new RegExp(`^http://127\\.0\\.0\\.1:${DEFAULT_PORTS[2]}/metrics$`), 'metrics on the default address');

  // The shim demo, exactly as printed, once apply has rendered the shims and applied the token.
  const rendered = await dev.waitForLog((l) => l.msg === 'shims rendered', 30_000);
  t.equal(rendered.dir, join(clone, '.state', 'shims'), 'shims rendered into ./.state/shims');
  await dev.waitForLog((l) => l.msg === 'token applied' && l.slot === 'cli:demo', 30_000);
  knownSecrets.add(readFileSync(join(clone, '.state', 'cli-proxy', 'demo.token'), 'utf8').trim());
  const whoami = (await dev.waitForStderr(/^\s+(PATH=\S+ acdemo whoami)$/))[1] as string;
  t.match(whoami, new RegExp(`^PATH=${clone}/\\.state/shims:`), 'the shim directory first on PATH');
  const out = execFileSync('sh', ['-c', whoami], { cwd: clone, env: userEnv(), encoding: 'utf8' });
  t.match(out, /"provider":"demo","tokenId":"tid_/, 'the demo API answered the shimmed CLI');
  t.notOk(dev.lines.some((l) => l.includes('inside the installed package')), 'no refusal of the shim directory');

  // Connect and disconnect, as dev printed them (the first as the README prints it too).
  const connect = (await dev.waitForStderr(/^\s+(npm run dev -- connect binding sandbox)$/))[1] as string;
  t.ok(readme.split('\n').some((l) => l.startsWith(`${connect} `) || l === connect), 'the README prints the connect command dev prints');
  const disconnect = (await dev.waitForStderr(/^\s+(npm run dev -- disconnect binding sandbox)$/))[1] as string;
  const runtime = JSON.parse(readFileSync(join(clone, '.state', 'dev.json'), 'utf8')) as { forwarder: string; bindingIds: Record<string, string> };
  const sandbox = `${runtime.forwarder}/i/${runtime.bindingIds.sandbox}/mcp`;
  t.ok(await gone(sandbox), 'sandbox is not served before the connect');
  await follow(t, connect, clone, sandbox, served);
  await follow(t, disconnect, clone, sandbox, gone);

  // Ctrl-C: the whole group gets SIGINT; dev stops, marks itself stopped, frees its ports.
  process.kill(-pgid, 'SIGINT');
  await dev.exited;
  t.ok(dev.logs.some((l) => l.msg === 'stopping' && l.signal === 'SIGINT'), 'dev stopped on SIGINT');
  await until(() => !groupAlive(pgid), 'no process of the group left', 15_000);
  const after = JSON.parse(readFileSync(join(clone, '.state', 'dev.json'), 'utf8')) as { pid: number | null };
  t.equal(after.pid, null, 'dev.json says no dev is running');
  for (const port of DEFAULT_PORTS) t.notOk(await portHeld(port), `port ${port} free again`);
});

checkNoLeaks(t);
