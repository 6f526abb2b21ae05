import t from 'tap';
import { parseAgentUsers, renderAgentUsers } from '../../src/data/agent-users.js';

t.test('parseAgentUsers: names and UIDs, comments and blank lines ignored', async (t) => {
  const r = parseAgentUsers('# agents\nalice\n\n  1001  # by uid\nsvc_bot$\nBob.smith-2\n');
  t.same(r, { ok: true, value: [{ name: 'alice' }, { uid: 1001 }, { name: 'svc_bot$' }, { name: 'Bob.smith-2' }] });
  t.same(parseAgentUsers(''), { ok: true, value: [] }, 'empty file: no users');
  t.same(parseAgentUsers('# only a comment\n'), { ok: true, value: [] });
});

t.test('parseAgentUsers: an invalid line rejects the file, naming the line and never its text', async (t) => {
  for (const [text, line] of [
    ['alice\nbob smith\n', 2],
    ['alice,bob\n', 1],
    ['\n\n-rf\n', 3],
    ['a'.repeat(40) + '\n', 1],
    ['alice\n12345678901\n', 2],
  ] as const) {
    const r = parseAgentUsers(text);
    t.equal(r.ok, false, JSON.stringify(text));
    if (!r.ok) {
      t.equal(r.error, `line ${line}: must be one user name or numeric UID`);
      t.notMatch(r.error, /bob|rf|aaaa|12345/, 'the text is not echoed');
    }
  }
});

t.test('renderAgentUsers: header when new; appends only what is missing; keeps the operator\'s lines', async (t) => {
  const fresh = renderAgentUsers(undefined, ['alice']);
  t.match(fresh, /^# Local users whose agents may call/);
  t.same(parseAgentUsers(fresh), { ok: true, value: [{ name: 'alice' }] });
  const edited = '# mine\nalice # claude\nbob';
  t.equal(renderAgentUsers(edited, ['alice']), edited, 'nothing to add: unchanged');
  t.equal(renderAgentUsers(edited, ['bob', 'carol', '1002']), '# mine\nalice # claude\nbob\ncarol\n1002\n');
});
