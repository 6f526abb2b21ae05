import { execFileSync, type ChildProcess } from 'node:child_process';
import { chmodSync, copyFileSync, mkdirSync, readdirSync, readlinkSync, renameSync, rmSync, statSync, symlinkSync, truncateSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { closeTokenFiles, heldTokenFiles, MAX_HELD_TOKEN_FILES, MAX_TOKEN_BYTES, parseToken, readTokenFile, sweepUnlinked } from '../../src/token/token-file.js';
import { existingUser, killGroup, spawnAsAgent } from '../support/agent-user.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

const KIB16 = 16 * 1024;

const dir = (): string => tempDir('ac-token-', t);

/** Root reads any file whatever its mode: the mode checks then run as `nobody`. */
const asRoot = process.getuid?.() === 0;

/**
 * readTokenFile in a long-lived process of an unprivileged UID, one read per request, so a
 * test can change a file between two reads of the same process (its held descriptors).
 * The module is copied next to nothing else: it imports only node:fs, and the checkout
 * may sit where `nobody` cannot enter.
 */
class UnprivilegedReader {
  private readonly answers: string[] = [];
  private waiting: ((line: string) => void) | undefined;

  private constructor(private readonly child: ChildProcess) {
    const out = child.stdout;
    if (!out) throw new Error('the reader has no stdout');
    createInterface({ input: out }).on('line', (line) => {
      const w = this.waiting;
      this.waiting = undefined;
      if (w) w(line);
      else this.answers.push(line);
    });
  }

  static async start(t: TapTest, file: string): Promise<UnprivilegedReader> {
    chmodSync(dirname(file), 0o755);
    const lib = tempDir('ac-token-lib-', t);
    chmodSync(lib, 0o755);
    const mod = join(lib, 'token-file.mjs');
    copyFileSync(fileURLToPath(new URL('../../src/token/token-file.js', import.meta.url)), mod);
    const script = [
      'const { readTokenFile } = await import(process.argv[1]);',
      "const rl = (await import('node:readline')).createInterface({ input: process.stdin });",
      "rl.on('line', () => process.stdout.write(JSON.stringify(readTokenFile(process.argv[2])) + '\\n'));",
    ].join('\n');
    const child = spawnAsAgent(existingUser('nobody'), 'exec "$@"', {
      env: { PATH: '/usr/bin:/bin' },
      args: [process.execPath, '--input-type=module', '-e', script, mod, file],
    });
    t.teardown(() => killGroup(child));
    return new UnprivilegedReader(child);
  }

  /** One readTokenFile in the child; its result as the child printed it. */
  read(): Promise<unknown> {
    const answer = new Promise<string>((resolve, reject) => {
      const queued = this.answers.shift();
      if (queued !== undefined) return resolve(queued);
      this.waiting = resolve;
      this.child.once('close', (code) => reject(new Error(`the reader exited (${code}) before answering: ${this.child.stderr?.read() ?? ''}`)));
    });
    this.child.stdin?.write('read\n');
    return answer.then((line) => JSON.parse(line) as unknown);
  }
}

function parse(s: string | Buffer): ReturnType<typeof parseToken> {
  return parseToken(typeof s === 'string' ? Buffer.from(s, 'latin1') : s);
}

t.test('the limit is 16 KiB', async (t) => {
  t.equal(MAX_TOKEN_BYTES, KIB16);
});

t.test('parseToken strips exactly one trailing \\n or \\r\\n', async (t) => {
  t.same(parse('abc'), { ok: true, token: 'abc' });
  t.same(parse('abc\n'), { ok: true, token: 'abc' });
  t.same(parse('abc\r\n'), { ok: true, token: 'abc' });
  // Only one line ending is stripped; what remains must be a single visible-ASCII line.
  t.same(parse('abc\n\n'), { ok: false, reason: 'malformed' });
  t.same(parse('abc\r\n\r\n'), { ok: false, reason: 'malformed' });
  t.same(parse('abc\r\r\n'), { ok: false, reason: 'malformed' });
  t.same(parse('abc\n\r\n'), { ok: false, reason: 'malformed' });
  t.same(parse('abc\r'), { ok: false, reason: 'malformed' }, 'a lone CR is not a line ending to strip');
  t.same(parse('\n\n'), { ok: false, reason: 'malformed' }, 'one newline left over: not a single line');
});

t.test('parseToken: empty', async (t) => {
  t.same(parse(''), { ok: false, reason: 'empty' });
  t.same(parse('\n'), { ok: false, reason: 'empty' });
  t.same(parse('\r\n'), { ok: false, reason: 'empty' });
});

t.test('parseToken: only visible ASCII, no spaces or control characters', async (t) => {
  let all = '';
  for (let c = 0x21; c <= 0x7e; c++) all += String.fromCharCode(c);
  t.same(parse(all), { ok: true, token: all }, 'every visible ASCII character is allowed');
  t.same(parse('eyJhbGciOi.eyJzdWIi.sig-_~+/='), { ok: true, token: 'eyJhbGciOi.eyJzdWIi.sig-_~+/=' });
  for (const bad of ['a b', ' abc', 'abc ', 'a\tb', 'a\nb', 'a\rb', 'a\x00b', 'a\x7fb', 'a\x1bb', '\x0b', ' ', 'abc \n']) {
    t.same(parse(bad), { ok: false, reason: 'malformed' }, JSON.stringify(bad));
  }
  t.same(parseToken(Buffer.from('tökén', 'utf8')), { ok: false, reason: 'malformed' }, 'UTF-8 non-ASCII');
  t.same(parseToken(Buffer.from([0x61, 0xa0, 0x62])), { ok: false, reason: 'malformed' }, 'latin-1 NBSP');
  t.same(parseToken(Buffer.from([0x61, 0xff])), { ok: false, reason: 'malformed' }, 'byte 0xff');
});

t.test('parseToken: at most 16 KiB', async (t) => {
  const max = 'a'.repeat(KIB16);
  t.same(parse(max), { ok: true, token: max });
  t.same(parse(`${max}\n`), { ok: true, token: max });
  t.same(parse(`${max}\r\n`), { ok: true, token: max });
  t.same(parse(`${max}a`), { ok: false, reason: 'malformed' });
  t.same(parse(`${max}a\n`), { ok: false, reason: 'malformed' });
});

t.test('readTokenFile against real files', async (t) => {
  const d = dir();
  const p = (name: string): string => join(d, name);

  t.test('regular token file', async (t) => {
    writeFileSync(p('ok.token'), 'tok-ABC.123\n', { mode: 0o600 });
    t.same(readTokenFile(p('ok.token')), { ok: true, token: 'tok-ABC.123' });
    writeFileSync(p('crlf.token'), 'tok-crlf\r\n');
    t.same(readTokenFile(p('crlf.token')), { ok: true, token: 'tok-crlf' });
    writeFileSync(p('bare.token'), 'tok-bare');
    t.same(readTokenFile(p('bare.token')), { ok: true, token: 'tok-bare' });
  });

  t.test('read afresh every time: a replaced file is seen at once', async (t) => {
    const f = p('swap.token');
    writeFileSync(f, 'first\n');
    t.same(readTokenFile(f), { ok: true, token: 'first' });
    writeFileSync(`${f}.new`, 'second\n');
    execFileSync('mv', [`${f}.new`, f]);
    t.same(readTokenFile(f), { ok: true, token: 'second' });
    writeFileSync(f, 'third\n');
    t.same(readTokenFile(f), { ok: true, token: 'third' });
  });

  t.test('missing file, missing parent, path through a file → missing', async (t) => {
    t.same(readTokenFile(p('nope.token')), { ok: false, reason: 'missing' });
    t.same(readTokenFile(p('no-dir/x.token')), { ok: false, reason: 'missing' });
    writeFileSync(p('plain'), 'x');
    t.same(readTokenFile(p('plain/x.token')), { ok: false, reason: 'missing' });
  });

  t.test('a directory counts as missing', async (t) => {
    mkdirSync(p('a-dir'));
    t.same(readTokenFile(p('a-dir')), { ok: false, reason: 'missing' });
  });

  t.test('a dangling symlink is missing; a symlink to a good file works', async (t) => {
    symlinkSync(p('does-not-exist'), p('dangling.token'));
    t.same(readTokenFile(p('dangling.token')), { ok: false, reason: 'missing' });
    writeFileSync(p('target.token'), 'via-link\n');
    symlinkSync(p('target.token'), p('link.token'));
    t.same(readTokenFile(p('link.token')), { ok: true, token: 'via-link' });
  });

  t.test('a FIFO is not a token file and does not block the reader', async (t) => {
    execFileSync('mkfifo', [p('fifo.token')]);
    const r = readTokenFile(p('fifo.token'));
    t.equal(r.ok, false);
    if (!r.ok) t.ok(r.reason === 'missing' || r.reason === 'unreadable', `reason ${r.reason}`);
  });

  t.test('mode 000 file is unreadable', async (t) => {
    writeFileSync(p('locked.token'), 'secret\n');
    chmodSync(p('locked.token'), 0o000);
    if (!asRoot) {
      t.same(readTokenFile(p('locked.token')), { ok: false, reason: 'unreadable' });
      return;
    }
    const reader = await UnprivilegedReader.start(t, p('locked.token'));
    t.same(await reader.read(), { ok: false, reason: 'unreadable' }, 'read by an unprivileged UID');
  });

  t.test('empty file → empty; newline only → empty', async (t) => {
    writeFileSync(p('empty.token'), '');
    t.same(readTokenFile(p('empty.token')), { ok: false, reason: 'empty' });
    writeFileSync(p('nl.token'), '\n');
    t.same(readTokenFile(p('nl.token')), { ok: false, reason: 'empty' });
  });

  t.test('exactly 16 KiB is fine (with or without line ending); 16 KiB + 1 is malformed', async (t) => {
    const max = 'Z'.repeat(KIB16);
    writeFileSync(p('max.token'), max);
    t.same(readTokenFile(p('max.token')), { ok: true, token: max });
    writeFileSync(p('max-nl.token'), `${max}\n`);
    t.same(readTokenFile(p('max-nl.token')), { ok: true, token: max });
    writeFileSync(p('max-crlf.token'), `${max}\r\n`);
    t.same(readTokenFile(p('max-crlf.token')), { ok: true, token: max });
    writeFileSync(p('over.token'), `${max}Z`);
    t.same(readTokenFile(p('over.token')), { ok: false, reason: 'malformed' });
    writeFileSync(p('over-nl.token'), `${max}Z\n`);
    t.same(readTokenFile(p('over-nl.token')), { ok: false, reason: 'malformed' });
    writeFileSync(p('over-crlf.token'), `${max}Z\r\n`);
    t.same(readTokenFile(p('over-crlf.token')), { ok: false, reason: 'malformed' });
    writeFileSync(p('two-lines.token'), `${max}\nsecond`);
    t.same(readTokenFile(p('two-lines.token')), { ok: false, reason: 'malformed' });
  });

  t.test('non-ASCII content is malformed', async (t) => {
    writeFileSync(p('utf8.token'), 'tök€n\n', 'utf8');
    t.same(readTokenFile(p('utf8.token')), { ok: false, reason: 'malformed' });
    writeFileSync(p('space.token'), 'Bearer abc\n');
    t.same(readTokenFile(p('space.token')), { ok: false, reason: 'malformed' });
    writeFileSync(p('bom.token'), '\ufeffabc\n', 'utf8');
    t.same(readTokenFile(p('bom.token')), { ok: false, reason: 'malformed' });
  });

  t.test('a 1 MB file of valid characters is malformed (too long)', async (t) => {
    writeFileSync(p('big.token'), 'a'.repeat(1024 * 1024));
    t.same(readTokenFile(p('big.token')), { ok: false, reason: 'malformed' });
  });

  t.test('a huge (sparse) file is not read entirely: it is malformed, not an I/O error', async (t) => {
    // 64 GiB: reading it whole would fail (ERR_FS_FILE_TOO_LARGE) or never finish; a
    // bounded read sees only the first few KiB and calls the content malformed.
    const f = p('huge.token');
    writeFileSync(f, 'a'.repeat(KIB16 + 100));
    truncateSync(f, 64 * 1024 * 1024 * 1024);
    t.same(readTokenFile(f), { ok: false, reason: 'malformed' });
  });
});

// A path read before is read through the descriptor held for it, after a stat that says
// the path still leads to that file (src/token/token-file.ts): every change a fresh open
// would see must be seen.
t.test('a held token file: every change is seen as a fresh open would see it', async (t) => {
  const d = dir();
  const p = (name: string): string => join(d, name);
  t.teardown(closeTokenFiles);

  t.test('rewritten in place, same size, mtime put back: the new bytes are read', async (t) => {
    const f = p('inplace.token');
    writeFileSync(f, 'token-AAAA\n');
    t.same(readTokenFile(f), { ok: true, token: 'token-AAAA' });
    const { atime, mtime, ino } = statSync(f);
    for (const next of ['token-BBBB', 'token-CCCC', 'token-DDDD']) {
      // Same inode, same size, and the same mtime as the read before: only the bytes differ.
      writeFileSync(f, `${next}\n`);
      utimesSync(f, atime, mtime);
      t.equal(statSync(f).ino, ino, 'rewritten in place');
      t.same(readTokenFile(f), { ok: true, token: next });
    }
    writeFileSync(f, '');
    t.same(readTokenFile(f), { ok: false, reason: 'empty' }, 'truncated in place');
    writeFileSync(f, 'a longer token than before\n');
    t.same(readTokenFile(f), { ok: false, reason: 'malformed' }, 'grown in place (with spaces: malformed)');
    writeFileSync(f, 'token-EEEE');
    t.same(readTokenFile(f), { ok: true, token: 'token-EEEE' });
  });

  t.test('renamed over, deleted, recreated', async (t) => {
    const f = p('cycle.token');
    writeFileSync(f, 'one\n');
    t.same(readTokenFile(f), { ok: true, token: 'one' });
    writeFileSync(`${f}.new`, 'two\n');
    renameSync(`${f}.new`, f);
    t.same(readTokenFile(f), { ok: true, token: 'two' });
    unlinkSync(f);
    t.same(readTokenFile(f), { ok: false, reason: 'missing' });
    t.same(readTokenFile(f), { ok: false, reason: 'missing' });
    writeFileSync(f, 'three\n');
    t.same(readTokenFile(f), { ok: true, token: 'three' });
  });

  t.test('a re-pointed symlink, a FIFO or a directory put in its place', async (t) => {
    writeFileSync(p('x.target'), 'via-x\n');
    writeFileSync(p('y.target'), 'via-y\n');
    const link = p('moving.token');
    symlinkSync(p('x.target'), link);
    t.same(readTokenFile(link), { ok: true, token: 'via-x' });
    symlinkSync(p('y.target'), `${link}.tmp`);
    renameSync(`${link}.tmp`, link);
    t.same(readTokenFile(link), { ok: true, token: 'via-y' });

    const f = p('becomes-fifo.token');
    writeFileSync(f, 'plain\n');
    t.same(readTokenFile(f), { ok: true, token: 'plain' });
    unlinkSync(f);
    execFileSync('mkfifo', [f]);
    const r = readTokenFile(f);
    t.equal(r.ok, false, 'a FIFO in its place is not read (and does not block)');

    const g = p('becomes-dir.token');
    writeFileSync(g, 'plain\n');
    t.same(readTokenFile(g), { ok: true, token: 'plain' });
    unlinkSync(g);
    mkdirSync(g);
    t.same(readTokenFile(g), { ok: false, reason: 'missing' });
    rmSync(g, { recursive: true });
    t.same(readTokenFile(join(g, 'under')), { ok: false, reason: 'missing' });
  });

  t.test('made mode 000 after a read: unreadable, as a fresh open finds it', async (t) => {
    const f = p('revoked.token');
    writeFileSync(f, 'secret\n');
    if (!asRoot) {
      t.same(readTokenFile(f), { ok: true, token: 'secret' });
      chmodSync(f, 0o000);
      t.same(readTokenFile(f), { ok: false, reason: 'unreadable' });
      return;
    }
    // The same process must read twice: the first read leaves the descriptor held.
    const reader = await UnprivilegedReader.start(t, f);
    t.same(await reader.read(), { ok: true, token: 'secret' });
    chmodSync(f, 0o000);
    t.same(await reader.read(), { ok: false, reason: 'unreadable' }, 'the held descriptor does not outlive the mode change');
  });

  t.test('a deleted file never read again is not held: the sweep closes it', async (t) => {
    closeTokenFiles();
    // What this process holds open on a file with no name left ("(deleted)" in /proc).
    const deletedHeld = (): string[] =>
      readdirSync('/proc/self/fd').flatMap((fd) => {
        try {
          const target = readlinkSync(`/proc/self/fd/${fd}`);
          return target.startsWith(d) && target.endsWith(' (deleted)') ? [target] : [];
        } catch {
          return [];
        }
      });
    const kept = p('kept.token');
    const gone = p('disconnected.token');
    writeFileSync(kept, 'still-here\n');
    writeFileSync(gone, 'revoked-token\n');
    t.same(readTokenFile(kept), { ok: true, token: 'still-here' });
    t.same(readTokenFile(gone), { ok: true, token: 'revoked-token' });
    // apply deletes a disconnected binding's token; its route is gone, so nobody reads the path again.
    unlinkSync(gone);
    t.equal(deletedHeld().length, 1, 'the deleted file is held until the sweep');
    sweepUnlinked();
    t.same(deletedHeld(), [], 'no deleted token file held open after the sweep');
    t.equal(heldTokenFiles(), 1, 'a file that still has its name stays held');
    t.same(readTokenFile(kept), { ok: true, token: 'still-here' });
    closeTokenFiles();
  });

  t.test('descriptors held are bounded, whatever the number of paths read', async (t) => {
    closeTokenFiles();
    const fds = (): number => readdirSync('/proc/self/fd').length;
    const before = fds();
    for (let i = 0; i < MAX_HELD_TOKEN_FILES * 3; i++) {
      const f = p(`many-${i}.token`);
      writeFileSync(f, `token-${i}\n`);
      t.same(readTokenFile(f), { ok: true, token: `token-${i}` });
    }
    t.equal(heldTokenFiles(), MAX_HELD_TOKEN_FILES);
    t.ok(fds() - before <= MAX_HELD_TOKEN_FILES, `${fds() - before} more descriptors open`);
    // The first paths were pushed out; reading them again still works.
    t.same(readTokenFile(p('many-0.token')), { ok: true, token: 'token-0' });
    closeTokenFiles();
    t.equal(heldTokenFiles(), 0);
    t.equal(fds(), before, 'every held descriptor closed');
  });
});
