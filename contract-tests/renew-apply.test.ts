import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import {
  checkNoLeaks,
  knownSecrets,
  leakedSecrets,
  startCli,
  writeJsonAtomic,
  type CliProc,
  type LogLine,
} from '../test/support/cli-proc.js';
import { until } from '../test/support/poll.js';
import type { TapTest } from '../test/support/tap.js';
import { tempDir } from '../test/support/temp-dir.js';
import type { SlotFileJson } from './helpers/renew-harness.js';

/**
 * `renew apply` (SPEC §4), black-box against the built CLI: one-shot runs and `--watch`.
 * Inbox files are written here the way `renew fetch` writes them (temp file, rename).
 */

const SLOT = 'instance:inst-a';
const APPLIED = 'token applied';
const IGNORED = 'inbox file is not newer than the applied token; ignored';
const REJECTED = 'inbox file rejected; moved aside, not applied';
/** Every rejection line starts so (an unreadable or oversized file is logged without ", not applied"). */
const isRejection = (l: LogLine): boolean => typeof l.msg === 'string' && l.msg.startsWith('inbox file rejected; moved aside');

interface Handoff {
  state: string;
  handoff: string;
  inbox: string;
  slots: string;
  rejected: string;
  /** The §2 default token file of inst-a (no registry). */
  tokenFile: string;
}

function setup(tt: TapTest): Handoff {
  const state = tempDir('ac-apply-');
  tt.teardown(() => rmSync(state, { recursive: true, force: true }));
  const handoff = join(state, 'handoff');
  for (const d of ['inbox', 'slots']) mkdirSync(join(handoff, d), { recursive: true });
  return {
    state,
    handoff,
    inbox: join(handoff, 'inbox'),
    slots: join(handoff, 'slots'),
    rejected: join(handoff, 'rejected'),
    tokenFile: join(state, 'mcp-forwarder', 'inst-a.token'),
  };
}

/** A fresh token (remembered as a secret for the leak checks). */
function newToken(label: string): string {
  const token = `tok-${label}-${randomBytes(18).toString('base64url')}`;
  knownSecrets.add(token);
  return token;
}

interface RenewBody {
  slot: string;
  tokenId: string;
  token: string;
  expiresAt: string;
  credentialGeneration: number;
}

const inMinutes = (m: number): string => new Date(Date.now() + m * 60_000).toISOString();

function body(label: string, generation: number, expiresAt: string, slot = SLOT): RenewBody {
  return { slot, tokenId: `tid-${label}-${randomBytes(6).toString('hex')}`, token: newToken(label), expiresAt, credentialGeneration: generation };
}

/** Writes an inbox file as fetch does: a dot temp file with the final mode, renamed into place. */
function writeInbox(h: Handoff, name: string, content: string | RenewBody): string {
  const text = typeof content === 'string' ? content : `${JSON.stringify(content)}\n`;
  const tmp = join(h.inbox, `.${name}.${process.pid}.tmp`);
  writeFileSync(tmp, text, { mode: 0o640 });
  const path = join(h.inbox, name);
  renameSync(tmp, path);
  return path;
}

interface Run {
  proc: CliProc;
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** Runs the CLI to completion (all output read). Its lines join the file's leak check. */
async function runCli(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  const proc = startCli(args, env);
  const [code, signal] = (await once(proc.child, 'close')) as [number | null, NodeJS.Signals | null];
  return { proc, code, signal };
}

function applyArgs(h: Handoff, extra: string[] = []): string[] {
  return ['renew', 'apply', '--handoff', h.handoff, '--state-dir', h.state, '--log-level', 'trace', ...extra];
}

async function applyOnce(tt: TapTest, h: Handoff, extra: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  const r = await runCli(applyArgs(h, extra), env);
  if (Object.keys(env).length === 0) tt.equal(r.code, 0, `renew apply exits 0${r.code === 0 ? '' : `: ${r.proc.lines.join('\n')}`}`);
  return r;
}

const logsWith = (proc: CliProc, msg: string): LogLine[] => proc.logs.filter((l) => l.msg === msg);

function slotPath(h: Handoff, slot = SLOT): string {
  return join(h.slots, `${slot}.json`);
}

function readSlot(h: Handoff, slot = SLOT): SlotFileJson {
  return JSON.parse(readFileSync(slotPath(h, slot), 'utf8')) as SlotFileJson;
}

const readText = (path: string): string => readFileSync(path, 'utf8');

t.test('apply writes the token file 0600 with exactly the token, a secret-free slot file, and removes the inbox file', async (t) => {
  const h = setup(t);
  const b = body('first', 1, inMinutes(30));
  const inboxFile = writeInbox(h, `${SLOT}.json`, b);

  const r = await applyOnce(t, h);
  t.equal(readText(h.tokenFile), `${b.token}\n`, 'token file holds exactly the token and one newline');
  t.equal(statSync(h.tokenFile).mode & 0o777, 0o600, 'token file is 0600');
  t.notOk(existsSync(inboxFile), 'the inbox file is removed');

  const slotText = readText(slotPath(h));
  t.same(leakedSecrets(slotText), [], 'the slot file holds no token');
  t.equal(statSync(slotPath(h)).mode & 0o777, 0o640, 'slot file is 0640');
  const slot = readSlot(h);
  t.match(slot, { slot: SLOT, tokenId: b.tokenId, expiresAt: b.expiresAt, generation: 1 }, 'slot file records what is applied');
  t.ok(typeof slot.appliedAt === 'string' && !Number.isNaN(Date.parse(slot.appliedAt)), 'slot file has appliedAt');
  t.notOk('token' in slot, 'no token field in the slot file');

  const applied = logsWith(r.proc, APPLIED);
  t.equal(applied.length, 1, 'one "token applied" line');
  t.equal(applied[0]?.slot, SLOT);
  t.equal(applied[0]?.tokenId, b.tokenId, 'the log names the tokenId (not a secret)');
  t.same(readdirSync(h.inbox), [], 'no leftovers in inbox/');
  t.notOk(existsSync(h.rejected) && readdirSync(h.rejected).length > 0, 'nothing rejected');
});

t.test('apply writes every tokenFile the registry names for the instance, and only those', async (t) => {
  const h = setup(t);
  const instances = join(h.state, 'registry', 'instances.json');
  mkdirSync(join(h.state, 'registry'), { recursive: true });
  const one = join(h.state, 'tokens-1', 'a.token');
  const two = join(h.state, 'tokens-2', 'a.token');
  const other = join(h.state, 'tokens-3', 'b.token');
  writeJsonAtomic(instances, {
    bind_apply_reg_0001: { instanceId: 'inst-a', upstreamUrl: 'http://127.0.0.1:9/mcp', tokenFile: one },
    bind_apply_reg_0002: { instanceId: 'inst-a', upstreamUrl: 'http://127.0.0.1:9/mcp', tokenFile: two },
    bind_apply_reg_0003: { instanceId: 'inst-b', upstreamUrl: 'http://127.0.0.1:9/mcp', tokenFile: other },
  });
  const b = body('registry', 1, inMinutes(30));
  writeInbox(h, `${SLOT}.json`, b);
  await applyOnce(t, h, ['--instances', instances]);
  for (const f of [one, two]) {
    t.equal(readText(f), `${b.token}\n`, `${f.slice(h.state.length)} holds the token`);
    t.equal(statSync(f).mode & 0o777, 0o600, 'and is 0600');
  }
  t.notOk(existsSync(other), "another instance's token file is not touched");
  t.notOk(existsSync(h.tokenFile), 'the §2 default is not used when the registry names files');
  t.equal(readSlot(h).tokenId, b.tokenId);
});

t.test('replay: the same inbox file again is a logged no-op, and is removed', async (t) => {
  const h = setup(t);
  const b = body('replay', 3, inMinutes(30));
  writeInbox(h, `${SLOT}.json`, b);
  await applyOnce(t, h);
  const before = statSync(h.tokenFile);
  const slotBefore = readText(slotPath(h));
  const slotStatBefore = statSync(slotPath(h));

  const inboxFile = writeInbox(h, `${SLOT}.json`, b);
  const r = await applyOnce(t, h);
  const after = statSync(h.tokenFile);
  t.equal(after.ino, before.ino, 'token file not replaced (same inode)');
  t.equal(after.mtimeMs, before.mtimeMs, 'token file not rewritten (same mtime)');
  t.equal(readText(h.tokenFile), `${b.token}\n`);
  t.equal(readText(slotPath(h)), slotBefore, 'slot file unchanged');
  t.equal(statSync(slotPath(h)).ino, slotStatBefore.ino, 'slot file not rewritten');
  t.notOk(existsSync(inboxFile), 'the replayed inbox file is removed');
  t.equal(logsWith(r.proc, APPLIED).length, 0, 'nothing applied');
  const ignored = logsWith(r.proc, IGNORED);
  t.equal(ignored.length, 1, 'one "not newer; ignored" line');
  t.equal(ignored[0]?.slot, SLOT);
  t.notOk(existsSync(h.rejected) && readdirSync(h.rejected).length > 0, 'a replay is not a rejection');
});

t.test('an older token never overwrites a newer one; a newer one always does', async (t) => {
  const h = setup(t);
  const expiry = inMinutes(10);
  // Each case is its own slot with generation 2 applied, so one run judges them all.
  const cases: Array<{ what: string; make: (slot: string, applied: RenewBody) => RenewBody; newer: boolean }> = [
    { what: 'lower generation with a later expiry', make: (s) => body('gen1-late', 1, inMinutes(60), s), newer: false },
    { what: 'same generation, earlier expiry', make: (s) => body('gen2-early', 2, inMinutes(5), s), newer: false },
    { what: 'same generation, same expiry, other tokenId', make: (s) => body('gen2-same', 2, expiry, s), newer: false },
    { what: 'the applied tokenId with a higher generation', make: (s, a) => ({ ...body('sameid', 3, inMinutes(90), s), tokenId: a.tokenId }), newer: false },
    { what: 'same generation, later expiry', make: (s) => body('gen2-late', 2, inMinutes(20), s), newer: true },
    { what: 'higher generation with an earlier expiry', make: (s) => body('gen3-early', 3, inMinutes(1), s), newer: true },
  ];
  const slotOf = (i: number): string => `instance:ord-${i}`;
  const tokenFileOf = (i: number): string => join(h.state, 'mcp-forwarder', `ord-${i}.token`);
  const applied = cases.map((_, i) => body(`applied${i}`, 2, expiry, slotOf(i)));
  for (const b of applied) writeInbox(h, `${b.slot}.json`, b);
  const first = await applyOnce(t, h);
  t.equal(logsWith(first.proc, APPLIED).length, cases.length, 'every slot got its generation-2 token');

  const candidates = cases.map((c, i) => c.make(slotOf(i), applied[i] as RenewBody));
  for (const b of candidates) writeInbox(h, `${b.slot}.json`, b);
  const r = await applyOnce(t, h);
  for (const [i, c] of cases.entries()) {
    const want = (c.newer ? candidates[i] : applied[i]) as RenewBody;
    t.equal(readText(tokenFileOf(i)), `${want.token}\n`, `${c.what}: token file holds the ${c.newer ? 'new' : 'applied'} token`);
    t.match(readSlot(h, slotOf(i)), { tokenId: want.tokenId, generation: want.credentialGeneration, expiresAt: want.expiresAt }, `${c.what}: slot file`);
    const lines = logsWith(r.proc, c.newer ? APPLIED : IGNORED).filter((l) => l.slot === slotOf(i));
    t.equal(lines.length, 1, `${c.what}: logged as ${c.newer ? 'applied' : 'ignored'}`);
    t.notOk(existsSync(join(h.inbox, `${slotOf(i)}.json`)), `${c.what}: inbox file removed`);
  }
  t.equal(logsWith(r.proc, APPLIED).length, cases.filter((c) => c.newer).length, 'nothing else applied');
});

t.test('torn or invalid inbox files are moved aside byte-for-byte, never applied, logged without the token', async (t) => {
  const h = setup(t);
  const json = (b: unknown): string => `${JSON.stringify(b)}\n`;
  const spaced = `tok-space-${randomBytes(9).toString('base64url')} ${randomBytes(9).toString('base64url')}-tail`;
  for (const part of spaced.split(' ')) knownSecrets.add(part);
  knownSecrets.add(spaced);

  interface Case {
    what: string;
    name: string;
    /** The slot whose applied token must stay (a good one is applied first). */
    slot: string;
    text: (b: RenewBody) => string;
  }
  const cases: Case[] = [
    {
      what: 'truncated JSON (cut after the token)',
      name: 'instance:bad-0.json',
      slot: 'instance:bad-0',
      // Key order puts the token before expiresAt: the cut keeps the whole token in the file.
      text: (b) => json(b).slice(0, json(b).indexOf('"expiresAt"') + 15),
    },
    { what: 'an empty file', name: 'instance:bad-1.json', slot: 'instance:bad-1', text: () => '' },
    {
      what: 'wrong schema: credentialGeneration is a string',
      name: 'instance:bad-2.json',
      slot: 'instance:bad-2',
      text: (b) => json({ ...b, credentialGeneration: '5' }),
    },
    {
      what: 'wrong schema: tokenId missing',
      name: 'instance:bad-3.json',
      slot: 'instance:bad-3',
      text: ({ tokenId: _gone, ...b }) => json(b),
    },
    {
      what: 'wrong schema: expiresAt not RFC 3339',
      name: 'instance:bad-4.json',
      slot: 'instance:bad-4',
      text: (b) => json({ ...b, expiresAt: 'tomorrow' }),
    },
    {
      what: 'slot field does not match the file name',
      name: 'instance:bad-5.json',
      slot: 'instance:bad-5',
      text: (b) => json({ ...b, slot: 'instance:other-5' }),
    },
    {
      what: 'a token with a space',
      name: 'instance:bad-6.json',
      slot: 'instance:bad-6',
      text: (b) => json({ ...b, token: spaced }),
    },
    { what: 'a file name that is not a slot', name: 'not-a-slot.json', slot: 'instance:bad-7', text: (b) => json(b) },
    {
      what: 'an oversized file (over 64 KiB)',
      name: 'instance:bad-9.json',
      slot: 'instance:bad-9',
      text: (b) => json({ ...b, pad: 'x'.repeat(70 * 1024) }),
    },
    {
      what: 'a file name with a character outside the slot alphabet',
      name: 'instance:bad 8.json',
      slot: 'instance:bad-8',
      text: (b) => json(b),
    },
  ];
  const tokenFileOf = (slot: string): string => join(h.state, 'mcp-forwarder', `${slot.slice('instance:'.length)}.token`);

  // A good token applied for every slot first: "never applied" means it stays.
  const good = cases.map((c) => body('good', 1, inMinutes(30), c.slot));
  for (const b of good) writeInbox(h, `${b.slot}.json`, b);
  await applyOnce(t, h);
  const before = cases.map((c) => ({ token: statSync(tokenFileOf(c.slot)), slot: readText(slotPath(h, c.slot)) }));

  // Then every bad file (each would be newer: generation 5) in one run.
  const texts = cases.map((c) => c.text(body('bad', 5, inMinutes(60), c.slot)));
  for (const [i, c] of cases.entries()) writeInbox(h, c.name, texts[i] ?? '');
  const r = await applyOnce(t, h);
  const rejectedNames = readdirSync(h.rejected);

  for (const [i, c] of cases.entries()) {
    const text = texts[i] ?? '';
    t.notOk(existsSync(join(h.inbox, c.name)), `${c.what}: gone from inbox/`);
    const kept = rejectedNames.filter((n) => n.startsWith(`${c.name}.`) && n.endsWith('.rejected'));
    t.equal(kept.length, 1, `${c.what}: kept in rejected/ as <name>.<stamp>.rejected (${kept.join(', ')})`);
    if (kept[0]) t.equal(readText(join(h.rejected, kept[0])), text, `${c.what}: content preserved byte-for-byte`);

    const goodToken = (good[i] as RenewBody).token;
    t.equal(readText(tokenFileOf(c.slot)), `${goodToken}\n`, `${c.what}: not applied (token file unchanged)`);
    t.equal(statSync(tokenFileOf(c.slot)).ino, before[i]?.token.ino, `${c.what}: token file not rewritten`);
    t.equal(readText(slotPath(h, c.slot)), before[i]?.slot, `${c.what}: slot file unchanged`);

    const rejected = r.proc.logs.filter((l) => isRejection(l) && l.file === c.name);
    t.equal(rejected.length, 1, `${c.what}: one rejection line naming the file`);
    const line = rejected[0];
    t.equal(line?.level, 'error', `${c.what}: logged as an error`);
    t.ok(typeof line?.reason === 'string' && line.reason.length > 0, `${c.what}: gives a reason (${String(line?.reason)})`);
  }
  t.equal(logsWith(r.proc, APPLIED).length, 0, 'nothing applied');
  t.notOk(existsSync(tokenFileOf('instance:other-5')), 'the mismatched slot got no token file');
  t.notOk(existsSync(slotPath(h, 'instance:other-5')), 'nor a slot file');
  t.equal(rejectedNames.length, cases.length, 'nothing else in rejected/');
  const everything = r.proc.lines.join('\n');
  const badTokens = texts.flatMap((text) => [...text.matchAll(/"token":"([^"]+)"/g)].map((m) => m[1] as string));
  t.ok(badTokens.length >= cases.length - 2, 'the bad files carried tokens to look for');
  t.same(badTokens.filter((tok) => everything.includes(tok)), [], 'no token of a bad file is in any log line');
  t.same(leakedSecrets(everything), [], 'no known secret in any log line');
});

t.test('SIGKILL mid-apply leaves the token file old or new, never partial; a rerun converges', async (t) => {
  interface Variant {
    hook: 'apply-mid-token-write' | 'apply-after-token-write';
    first: boolean;
    h: Handoff;
    old?: RenewBody;
    next: RenewBody;
    slotBefore?: string;
  }
  const variants: Variant[] = [];
  for (const hook of ['apply-mid-token-write', 'apply-after-token-write'] as const) {
    for (const first of [false, true]) variants.push({ hook, first, h: setup(t), next: body('new', 2, inMinutes(20)) });
  }
  const label = (v: Variant): string => `${v.hook}${v.first ? ' (first token)' : ''}`;
  // The variants are independent hand-off dirs: run them side by side.
  await Promise.all(
    variants.map(async (v) => {
      if (v.first) return;
      v.old = body('old', 1, inMinutes(10));
      writeInbox(v.h, `${SLOT}.json`, v.old);
      await applyOnce(t, v.h);
      v.slotBefore = readText(slotPath(v.h));
    }),
  );
  for (const v of variants) writeInbox(v.h, `${SLOT}.json`, v.next);
  const crashed = await Promise.all(variants.map((v) => applyOnce(t, v.h, [], { AGENT_CONNECTORS_TEST_HOOKS: `crash:${v.hook}` })));
  for (const [i, v] of variants.entries()) {
    const what = label(v);
    t.equal(crashed[i]?.signal, 'SIGKILL', `${what}: the crash point fired (killed by SIGKILL)`);
    const allowed = [...(v.old ? [`${v.old.token}\n`] : []), `${v.next.token}\n`];
    const seen = existsSync(v.h.tokenFile) ? readText(v.h.tokenFile) : undefined;
    if (seen === undefined) t.ok(v.first, `${what}: the token file may be missing only if there was none before`);
    else {
      t.ok(allowed.includes(seen), `${what}: the token file is the old token or the new one, complete`);
      t.equal(statSync(v.h.tokenFile).mode & 0o777, 0o600, `${what}: and is 0600`);
    }
    const held = seen === undefined ? 'nothing' : seen === `${v.next.token}\n` ? 'the new token' : seen === allowed[0] ? 'the old token' : 'a PARTIAL or foreign file';
    t.comment(`${what}: after the crash the token file held ${held}`);
    t.ok(existsSync(join(v.h.inbox, `${SLOT}.json`)), `${what}: the inbox file survives the crash (nothing lost)`);
    t.equal(existsSync(slotPath(v.h)) ? readText(slotPath(v.h)) : undefined, v.slotBefore, `${what}: the slot file was not updated before the token file`);
  }

  const reruns = await Promise.all(variants.map((v) => applyOnce(t, v.h)));
  for (const [i, v] of variants.entries()) {
    const what = label(v);
    t.equal(readText(v.h.tokenFile), `${v.next.token}\n`, `${what}: rerun: the token file holds the new token`);
    t.equal(statSync(v.h.tokenFile).mode & 0o777, 0o600, `${what}: rerun: 0600`);
    t.match(readSlot(v.h), { slot: SLOT, tokenId: v.next.tokenId, generation: 2, expiresAt: v.next.expiresAt }, `${what}: rerun: slot file updated`);
    t.notOk(existsSync(join(v.h.inbox, `${SLOT}.json`)), `${what}: rerun: inbox file removed`);
    t.equal(logsWith((reruns[i] as Run).proc, APPLIED).length, 1, `${what}: rerun: logged as applied`);
  }
});

t.test('--watch applies inbox files as they arrive, each one, in order', async (t) => {
  const h = setup(t);
  const proc = startCli(applyArgs(h, ['--watch']));
  t.teardown(() => proc.stop('SIGKILL'));

  const sequence: RenewBody[] = [];
  for (let gen = 1; gen <= 6; gen++) {
    const b = body(`watch${gen}`, gen, inMinutes(30 + gen));
    sequence.push(b);
    const inboxFile = writeInbox(h, `${SLOT}.json`, b);
    await until(
      () => !existsSync(inboxFile) && existsSync(h.tokenFile) && readText(h.tokenFile) === `${b.token}\n`,
      `generation ${gen} to be applied by the watcher`,
    );
    t.equal(readSlot(h).tokenId, b.tokenId, `generation ${gen}: slot file updated`);
    if (gen === 3) {
      // A bad file in between is rejected and does not stop the watcher.
      const bad = writeInbox(h, 'cli:broken.json', '{"slot":"cli:broken",');
      await until(() => !existsSync(bad), 'the watcher to move the bad file aside');
      t.ok(readdirSync(h.rejected).some((n) => n.startsWith('cli:broken.json.')), 'the bad file is in rejected/');
    }
  }
  // A second slot, interleaved: it gets its own token file.
  const other = body('watch-other', 1, inMinutes(30), 'instance:inst-w');
  writeInbox(h, 'instance:inst-w.json', other);
  const otherFile = join(h.state, 'mcp-forwarder', 'inst-w.token');
  await until(() => existsSync(otherFile) && readText(otherFile) === `${other.token}\n`, 'the second slot to be applied');
  // The file is written before its log line reaches us through the pipe; the lines come in
  // order, so once this one is here, every earlier one is too.
  await proc.waitForLog((l) => l.msg === APPLIED && l.tokenId === other.tokenId, 30_000);

  t.same(
    logsWith(proc, APPLIED).map((l) => l.tokenId),
    [...sequence.map((b) => b.tokenId), other.tokenId],
    'each file applied exactly once, in arrival order',
  );
  t.equal(logsWith(proc, REJECTED).length, 1, 'the bad file was rejected');
  t.equal(readText(h.tokenFile), `${sequence.at(-1)?.token}\n`, 'the newest token is in force');
  const stopped = await proc.stop('SIGTERM');
  t.equal(stopped.code, 0, '--watch exits 0 on SIGTERM');
});

t.test('bind --handoff creates the slot with tokenId null; unbind of the last binding retires it', async (t) => {
  const h = setup(t);
  const bind = (id: string, instance: string): Promise<Run> =>
    runCli(['bind', id, '--instance-id', instance, '--upstream', 'http://127.0.0.1:9/mcp', '--state-dir', h.state, '--handoff', h.handoff]);
  const unbind = (id: string): Promise<Run> => runCli(['unbind', id, '--state-dir', h.state, '--handoff', h.handoff]);
  const slotS = 'instance:inst-s';

  let r = await bind('bind_slot_s_0001', 'inst-s');
  t.equal(r.code, 0, r.proc.lines.join('\n'));
  t.ok(existsSync(slotPath(h, slotS)), 'bind created slots/instance:inst-s.json');
  t.strictSame(readSlot(h, slotS), { slot: slotS, tokenId: null, expiresAt: null, generation: 0 }, 'with tokenId null (renewed at once)');
  t.equal(statSync(slotPath(h, slotS)).mode & 0o777, 0o640, 'slot file is 0640');

  // A token gets applied; a second binding of the same instance must not reset the slot.
  const b = body('bound', 1, inMinutes(30), slotS);
  writeInbox(h, `${slotS}.json`, b);
  await applyOnce(t, h);
  t.equal(readText(join(h.state, 'mcp-forwarder', 'inst-s.token')), `${b.token}\n`, 'apply wrote the §2 default token file bind named');
  r = await bind('bind_slot_s_0002', 'inst-s');
  t.equal(r.code, 0);
  t.equal(readSlot(h, slotS).tokenId, b.tokenId, 'a second bind of the instance keeps the applied token in the slot');

  r = await bind('bind_slot_t_0001', 'inst-t');
  t.equal(r.code, 0);
  t.ok(existsSync(slotPath(h, 'instance:inst-t')), 'another instance gets its own slot');

  r = await unbind('bind_slot_s_0001');
  t.equal(r.code, 0, r.proc.lines.join('\n'));
  t.ok(existsSync(slotPath(h, slotS)), 'unbind of one of two bindings keeps the slot');
  r = await unbind('bind_slot_s_0002');
  t.equal(r.code, 0);
  t.notOk(existsSync(slotPath(h, slotS)), 'unbind of the last binding removes the slot');
  t.ok(existsSync(slotPath(h, 'instance:inst-t')), "the other instance's slot stays");
  t.same(leakedSecrets(readdirSync(h.slots).map((n) => readText(join(h.slots, n))).join('\n')), [], 'no secret in any slot file');
});

checkNoLeaks(t);

t.test('SIGKILL mid-batch: each token file old or new, never partial; the batch stays and a rerun converges', async (t) => {
  const slots = ['instance:inst-a', 'instance:inst-b', 'instance:inst-c'];
  const tokenFileOf = (h: Handoff, slot: string): string => join(h.state, 'mcp-forwarder', `${slot.slice('instance:'.length)}.token`);
  const batchName = 'batch-1893499200000001-0123456789ab.json';
  for (const hook of ['apply-mid-token-write', 'apply-after-token-write'] as const) {
    const h = setup(t);
    // An older token applied first, from a per-slot file (what the previous link wrote).
    const old = body('old', 1, inMinutes(10));
    writeInbox(h, `${SLOT}.json`, old);
    await applyOnce(t, h);
    const slotBefore = readText(slotPath(h));
    const next = slots.map((s) => body(`new-${s.slice(-1)}`, 2, inMinutes(20), s));
    const batch = writeInbox(h, batchName, `${JSON.stringify({ v: 1, entries: next })}\n`);
    const crashed = await applyOnce(t, h, [], { AGENT_CONNECTORS_TEST_HOOKS: `crash:${hook}` });
    t.equal(crashed.signal, 'SIGKILL', `${hook}: the crash point fired`);
    t.ok(existsSync(batch), `${hook}: the batch survives the crash (nothing lost)`);
    for (const [i, s] of slots.entries()) {
      const f = tokenFileOf(h, s);
      const seen = existsSync(f) ? readText(f) : undefined;
      const allowed = [...(s === SLOT ? [`${old.token}\n`] : []), `${next[i]?.token}\n`];
      if (seen === undefined) t.not(s, SLOT, `${hook}: ${s}: missing only if it had none`);
      else t.ok(allowed.includes(seen), `${hook}: ${s}: the old token or the new one, whole`);
    }
    t.equal(readText(slotPath(h)), slotBefore, `${hook}: no slot file updated before every token of the batch was on disk`);

    const rerun = await applyOnce(t, h);
    for (const [i, s] of slots.entries()) {
      t.equal(readText(tokenFileOf(h, s)), `${next[i]?.token}\n`, `${hook}: rerun: ${s} holds its new token`);
      t.equal(statSync(tokenFileOf(h, s)).mode & 0o777, 0o600);
      t.match(JSON.parse(readText(join(h.slots, `${s}.json`))) as unknown, { slot: s, tokenId: next[i]?.tokenId, generation: 2 }, `${hook}: rerun: ${s} slot file`);
    }
    t.notOk(existsSync(batch), `${hook}: rerun: the batch removed`);
    t.equal(logsWith(rerun.proc, APPLIED).length, 3, `${hook}: rerun: three applied`);
    t.same(readdirSync(join(h.state, 'mcp-forwarder')).filter((n) => n.startsWith('.')), [], `${hook}: rerun: no temp left`);
  }
});
