import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { ensureAgentUser, runAsAgent } from '../test/support/agent-user.js';
import { checkNoLeaks, knownSecrets, REPO_ROOT, startCli, type CliProc, type LogLine } from '../test/support/cli-proc.js';
import { until, within } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';

/**
 * Issue 21, item 5: a compromised link cannot act outside the hand-off. The link owns
 * nothing of apply's, but its group may create entries in the hand-off root (the sticky
 * bit keeps it from renaming apply's: (g)) and create and rename entries of inbox/; this
 * test plays that link against a real `renew apply --watch`: a symlinked rejected/, a FIFO, a /dev/zero link and a huge file as desired-state.json,
 * symlinks and FIFOs in the inbox. apply must not follow, not block, not read unbounded,
 * and keep applying what is good.
 */

const APPLIED = 'token applied';
const STATE_REJECTED = 'desired state rejected; the last good one stays in force';
/** systemd's TimeoutStopSec for the apply unit: a stop must finish within it. */
const STOP_GRACE_MS = 20_000;

interface Rig {
  state: string;
  handoff: string;
  inbox: string;
  rejected: string;
  shimDir: string;
  desiredState: string;
  tokenFile: (instance: string) => string;
  apply: CliProc;
}

async function rig(tt: TapTest, before: (r: Omit<Rig, 'apply'>) => void = () => undefined): Promise<Rig> {
  const state = tempDir('ac-sec-handoff-', tt);
  const handoff = join(state, 'handoff');
  for (const d of ['inbox', 'slots']) mkdirSync(join(handoff, d), { recursive: true });
  const shimDir = join(state, 'shim-out');
  mkdirSync(shimDir);
  const base = {
    state,
    handoff,
    inbox: join(handoff, 'inbox'),
    rejected: join(handoff, 'rejected'),
    shimDir,
    desiredState: join(handoff, 'desired-state.json'),
    tokenFile: (instance: string) => join(state, 'mcp-forwarder', `${instance}.token`),
  };
  before(base);
  const apply = startCli(['renew', 'apply', '--watch', '--handoff', handoff, '--state-dir', state, '--shim-dir', shimDir, '--log-level', 'trace']);
  tt.teardown(() => apply.stop('SIGKILL'));
  await apply.waitForLog((l) => l.msg === 'apply watching');
  return { ...base, apply };
}

/**
 * With a desired-state.json present the host is managed: only slots in force take tokens.
 * The slot a later good hand-off is for, as an earlier good state left it.
 */
function slotInForce(b: Pick<Rig, 'handoff'>, instance: string): void {
  const slot = `instance:${instance}`;
  writeFileSync(join(b.handoff, 'slots', `${slot}.json`), `${JSON.stringify({ slot, tokenId: null, expiresAt: null, generation: 0 })}\n`, { mode: 0o640 });
}

const inMinutes = (m: number): string => new Date(Date.now() + m * 60_000).toISOString();

/** A renewal answer for `instance:<instance>`, written as the link writes it (temp file, rename). */
function handOff(r: Rig, instance: string): { token: string; tokenId: string } {
  const token = `tok-sec-${instance}-${randomBytes(18).toString('base64url')}`;
  knownSecrets.add(token);
  const tokenId = `tid-${randomBytes(6).toString('hex')}`;
  const slot = `instance:${instance}`;
  const body = { slot, tokenId, token, expiresAt: inMinutes(30), credentialGeneration: 1 };
  const tmp = join(r.inbox, `.${slot}.json.tmp`);
  writeFileSync(tmp, `${JSON.stringify(body)}\n`, { mode: 0o640 });
  renameSync(tmp, join(r.inbox, `${slot}.json`));
  return { token, tokenId };
}

const appliedFor = (tokenId: string) => (l: LogLine) => l.msg === APPLIED && l.tokenId === tokenId;
const aboutFile = (name: string) => (l: LogLine) => l.file === name;

/** The process exits within the stop grace after SIGTERM (the exit event, not a sleep). */
async function stopsWithinGrace(tt: TapTest, apply: CliProc): Promise<void> {
  apply.child.kill('SIGTERM');
  const exit = await within(apply.exited, STOP_GRACE_MS, 'apply to exit after SIGTERM').catch((err: Error) => err);
  tt.notOk(exit instanceof Error, `apply exits on SIGTERM within ${STOP_GRACE_MS / 1000} s${exit instanceof Error ? ` (${exit.message})` : ''}`);
}

/** After a refusal: the next good hand-off is applied, and SIGTERM still stops apply. */
async function keepsWorking(tt: TapTest, r: Rig): Promise<void> {
  const good = handOff(r, 'inst-a');
  await r.apply.waitForLog(appliedFor(good.tokenId));
  tt.equal(readFileSync(r.tokenFile('inst-a'), 'utf8'), `${good.token}\n`, 'the next good hand-off is applied');
  await stopsWithinGrace(tt, r.apply);
}

t.test('(a) rejected/ swapped for a symlink to the shim directory: a malformed hand-off stays put, nothing lands in PATH, good files still apply', async (t) => {
  const r = await rig(t);
  // The link renames apply's rejected/ away and plants a link to the agents' PATH directory.
  if (existsSync(r.rejected)) renameSync(r.rejected, `${r.rejected}.old`);
  symlinkSync(r.shimDir, r.rejected);

  const mark = r.apply.logs.length;
  const bad = 'instance:inst-bad.json';
  writeFileSync(join(r.inbox, bad), '#!/bin/sh\nid > /tmp/pwned\n', { mode: 0o755 });
  await r.apply.waitForLog(aboutFile(bad), 10_000, mark);
  t.same(readdirSync(r.shimDir), [], 'nothing was moved into the shim directory');
  t.ok(lstatSync(r.rejected).isSymbolicLink(), 'the planted link is left as it is (not followed, not written through)');
  t.ok(existsSync(join(r.inbox, bad)), 'the malformed file stays in the inbox');
  t.ok(r.apply.since(mark).some((l) => l.msg === 'rejected/ refused; the inbox file stays where it is' && l.file === bad), 'the refusal is logged');

  const good = handOff(r, 'inst-a');
  await r.apply.waitForLog(appliedFor(good.tokenId), 10_000, mark);
  t.equal(readFileSync(r.tokenFile('inst-a'), 'utf8'), `${good.token}\n`, 'a good hand-off beside it is applied');
  t.same(readdirSync(r.shimDir), [], 'still nothing in the shim directory');
});

t.test('(b) desired-state.json a FIFO: apply keeps applying the inbox, and SIGTERM stops it within its grace', async (t) => {
  const r = await rig(t, (b) => {
    execFileSync('mkfifo', [b.desiredState]);
    slotInForce(b, 'inst-a');
  });
  const rejected = await r.apply.waitForLog((l) => l.msg === STATE_REJECTED);
  t.equal(rejected.reason, 'desired-state.json is not a regular file', 'the FIFO is refused, unread');
  const applied = JSON.parse(readFileSync(join(r.handoff, 'applied-state.json'), 'utf8')) as { rejected?: { version: unknown; error: string } };
  t.match(applied.rejected, { version: null, error: 'desired-state.json is not a regular file' }, 'the refusal is on record for presence and doctor');

  const good = handOff(r, 'inst-a');
  await r.apply.waitForLog(appliedFor(good.tokenId));
  t.equal(readFileSync(r.tokenFile('inst-a'), 'utf8'), `${good.token}\n`, 'the inbox is still applied');
  await stopsWithinGrace(t, r.apply);
});

t.test('(c) desired-state.json a symlink to /dev/zero, then a 100 MB file: refused unread, apply keeps working', async (t) => {
  const r = await rig(t, (b) => {
    symlinkSync('/dev/zero', b.desiredState);
    slotInForce(b, 'inst-a');
  });
  const first = await r.apply.waitForLog((l) => l.msg === STATE_REJECTED);
  t.equal(first.reason, 'desired-state.json is a symlink', '/dev/zero behind a symlink is not followed');

  // Replaced by a 100 MB (sparse) file, renamed in as the link writes.
  const mark = r.apply.logs.length;
  const huge = join(r.handoff, '.desired-state.json.tmp');
  writeFileSync(huge, '');
  truncateSync(huge, 100 * 1024 * 1024);
  renameSync(huge, r.desiredState);
  const second = await r.apply.waitForLog((l) => l.msg === STATE_REJECTED, 10_000, mark);
  t.equal(second.reason, 'desired-state.json is larger than 8388608 bytes', 'the oversized file is refused by its size, not read');
  await keepsWorking(t, r);
});

t.test("(d) an inbox file that is a symlink to another slot's token file is not followed", async (t) => {
  const r = await rig(t);
  const other = handOff(r, 'inst-b');
  await r.apply.waitForLog(appliedFor(other.tokenId));

  const mark = r.apply.logs.length;
  const name = 'instance:inst-a.json';
  symlinkSync(r.tokenFile('inst-b'), join(r.inbox, name));
  const line = await r.apply.waitForLog(aboutFile(name), 10_000, mark);
  t.equal(line.reason, 'symlink', 'refused as a symlink');
  t.equal(readFileSync(r.tokenFile('inst-b'), 'utf8'), `${other.token}\n`, "the other slot's token file is untouched");
  t.ok(lstatSync(r.tokenFile('inst-b')).isFile(), 'and still a regular file in place');
  t.notOk(existsSync(r.tokenFile('inst-a')), 'nothing written for inst-a');
  const moved = readdirSync(r.rejected);
  t.equal(moved.length, 1, 'the link itself is moved aside');
  t.ok(lstatSync(join(r.rejected, moved[0] ?? '')).isSymbolicLink(), 'as a link (its target never read)');
});

t.test('(e) an inbox file that is a FIFO is moved aside at once, never waited on', async (t) => {
  const r = await rig(t);
  const mark = r.apply.logs.length;
  const name = 'instance:inst-fifo.json';
  execFileSync('mkfifo', [join(r.inbox, name)]);
  const line = await r.apply.waitForLog(aboutFile(name), 10_000, mark);
  t.equal(line.reason, 'not-regular', 'refused as not a regular file');
  await keepsWorking(t, r);
});

t.test('(f) an oversized inbox file is refused by its size', async (t) => {
  const r = await rig(t);
  const mark = r.apply.logs.length;
  const name = 'instance:inst-big.json';
  const tmp = join(r.inbox, `.${name}.tmp`);
  writeFileSync(tmp, '');
  truncateSync(tmp, 100 * 1024 * 1024);
  renameSync(tmp, join(r.inbox, name));
  const line = await r.apply.waitForLog(aboutFile(name), 10_000, mark);
  t.equal(line.reason, 'too-large', 'refused by its size, unread');
});

/**
 * The hand-off root's mode as the package makes it: the `d` line of the shipped tmpfiles.d
 * file (what postinst and `install` run systemd-tmpfiles on).
 */
function installedModes(): Map<string, number> {
  const conf = readFileSync(join(REPO_ROOT, 'units', 'tmpfiles.d', 'agent-connectors.conf'), 'utf8');
  const modes = new Map<string, number>();
  for (const m of conf.matchAll(/^d\s+\/var\/lib\/agent-connectors\/(handoff(?:\/\w+)?)\s+([0-7]{3,4})\s/gm)) modes.set(m[1] ?? '', parseInt(m[2] ?? '', 8));
  return modes;
}

t.test("(g) as the link's user: rejected/, inbox/ and slots/ cannot be swapped for a symlink in the hand-off root as installed", async (t) => {
  const link = ensureAgentUser();
  // The hand-off group, as the link holds it (a numeric gid: setpriv needs no group entry).
  const handoffGid = 64_999;
  const modes = installedModes();
  const r = await rig(t, (b) => {
    chmodSync(b.state, 0o755);
    for (const [dir, path] of [['handoff', b.handoff], ['handoff/inbox', b.inbox], ['handoff/slots', join(b.handoff, 'slots')]] as const) {
      chownSync(path, 0, handoffGid);
      chmodSync(path, modes.get(dir) ?? 0);
    }
  });
  t.ok(lstatSync(r.rejected).isDirectory(), 'apply made rejected/');
  const asLink = (script: string) => runAsAgent({ ...link, gid: handoffGid }, script, { env: { PATH: '/usr/bin:/bin' }, cwd: r.handoff, timeoutMs: 10_000 });

  const own = await asLink('echo 1 > .d.tmp && mv .d.tmp desired-state.json && echo 2 > .d.tmp && mv .d.tmp desired-state.json && rm desired-state.json');
  t.equal(own.code, 0, `the link still writes and replaces its own files in the root (${own.stderr.trim()})`);

  for (const dir of ['rejected', 'inbox', 'slots']) {
    const swap = await asLink(`mv ${dir} ${dir}.old && ln -s ${r.shimDir} ${dir}`);
    t.not(swap.code, 0, `${dir}/: the rename is refused`);
    t.match(swap.stderr, /Operation not permitted/, 'EPERM (the sticky bit)');
    t.notOk(lstatSync(join(r.handoff, dir)).isSymbolicLink(), `${dir}/ is still apply's directory`);
  }
  // What the swap was for: a malformed inbox file moved aside lands in rejected/, not the shim directory.
  const mark = r.apply.logs.length;
  const bad = 'instance:inst-bad.json';
  writeFileSync(join(r.inbox, bad), '#!/bin/sh\nid > /tmp/pwned\n', { mode: 0o755 });
  await r.apply.waitForLog(aboutFile(bad), 30_000, mark);
  t.same(readdirSync(r.shimDir), [], 'nothing in the shim directory');
  t.ok(readdirSync(r.rejected).some((n) => n.startsWith(`${bad}.`)), 'the malformed file is in rejected/');
});

checkNoLeaks(t);

/** A batch name as the link makes it (the sequence and random part given). */
const batchName = (seq: number, hex: string): string => `batch-${String(seq).padStart(16, '0')}-${hex}.json`;

t.test('(h) inbox batches are hostile input too: a symlink, a FIFO, an oversized batch refused unread; a bad entry costs only itself', async (t) => {
  const r = await rig(t);
  const other = handOff(r, 'inst-b');
  await r.apply.waitForLog(appliedFor(other.tokenId));

  // A symlink batch pointing at another slot's token file: not followed.
  let mark = r.apply.logs.length;
  const link = batchName(1, 'aaaaaaaaaaaa');
  symlinkSync(r.tokenFile('inst-b'), join(r.inbox, link));
  t.equal((await r.apply.waitForLog(aboutFile(link), 10_000, mark)).reason, 'symlink', 'a symlink batch refused as a symlink');
  t.equal(readFileSync(r.tokenFile('inst-b'), 'utf8'), `${other.token}\n`, "the other slot's token file untouched");

  // A FIFO batch: moved aside at once, never waited on.
  mark = r.apply.logs.length;
  const fifo = batchName(2, 'bbbbbbbbbbbb');
  execFileSync('mkfifo', [join(r.inbox, fifo)]);
  t.equal((await r.apply.waitForLog(aboutFile(fifo), 10_000, mark)).reason, 'not-regular', 'a FIFO batch refused');

  // An oversized batch: refused by its size, unread.
  mark = r.apply.logs.length;
  const big = batchName(3, 'cccccccccccc');
  const tmp = join(r.inbox, `.${big}.tmp`);
  writeFileSync(tmp, '');
  truncateSync(tmp, 100 * 1024 * 1024);
  renameSync(tmp, join(r.inbox, big));
  t.equal((await r.apply.waitForLog(aboutFile(big), 10_000, mark)).reason, 'too-large', 'an oversized batch refused');

  // A batch with a good entry between two bad ones (one naming a token file by a path, one
  // carrying an extra field): the good one applied, each bad one kept alone in rejected/.
  mark = r.apply.logs.length;
  const token = `tok-sec-batch-${randomBytes(18).toString('base64url')}`;
  knownSecrets.add(token);
  const good = { slot: 'instance:inst-a', tokenId: `tid-${randomBytes(6).toString('hex')}`, token, expiresAt: inMinutes(30), credentialGeneration: 1 };
  const badToken = `tok-sec-bad-${randomBytes(18).toString('base64url')}`;
  knownSecrets.add(badToken);
  const entries = [
    { slot: 'instance:../../etc/passwd', tokenId: 'tid-x', token: badToken, expiresAt: inMinutes(30), credentialGeneration: 1 },
    good,
    { ...good, slot: 'instance:inst-c', tokenFile: '/etc/shadow' },
  ];
  const mixed = batchName(4, 'dddddddddddd');
  writeFileSync(join(r.inbox, `.${mixed}.tmp`), `${JSON.stringify({ v: 1, entries })}\n`, { mode: 0o640 });
  renameSync(join(r.inbox, `.${mixed}.tmp`), join(r.inbox, mixed));
  await r.apply.waitForLog(appliedFor(good.tokenId), 10_000, mark);
  t.equal(readFileSync(r.tokenFile('inst-a'), 'utf8'), `${token}\n`, 'the good entry applied');
  t.notOk(existsSync(r.tokenFile('inst-c')), 'no token for the entry with an extra field');
  const entryLines = r.apply.since(mark).filter((l) => l.msg === 'inbox batch entry rejected; kept in rejected/, the rest of the batch applied');
  t.same(entryLines.map((l) => l.entry).sort(), [0, 2], 'both bad entries logged, by index');
  t.ok(readdirSync(r.rejected).filter((n) => n.startsWith(`${mixed}.`)).length === 2, 'each kept as its own file in rejected/');
  // Removed once every entry's slot file is durable: after the applied line, within the pass.
  await until(() => !existsSync(join(r.inbox, mixed)), 'the batch to be removed', 10_000);
  t.pass('the batch removed');
  t.notOk(r.apply.lines.join('\n').includes(badToken), 'no token of a bad entry in any log line');
  await keepsWorking(t, r);
});
