import { readFile, stat } from 'node:fs/promises';
import { z } from 'zod';
import type { ParseResult } from './parse.js';

/**
 * /etc/agent-connectors/agent-users: the local users whose agents may use the proxies.
 * One user name or numeric UID per line; `#` starts a comment; blank lines are ignored.
 * Plain text rather than JSON because operators edit it by hand (and `install
 * --agent-user` appends to it).
 */
export const AGENT_USERS_FILE = '/etc/agent-connectors/agent-users';

/** A POSIX-ish user name (useradd's default NAME_REGEX, plus upper case) or a UID. */
export const agentUserEntry = z.union([
  z.string().regex(/^\d{1,10}$/).transform((v) => ({ uid: Number(v) })),
  z
    .string()
    .regex(/^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$/, 'must be a user name or a numeric UID')
    .transform((v) => ({ name: v })),
]);
export type AgentUserEntry = { uid: number } | { name: string };

const agentUsersSchema = z.array(agentUserEntry);

/** The file's entries, in order; an invalid line rejects the whole file (its line number, never its text). */
export function parseAgentUsers(text: string): ParseResult<AgentUserEntry[]> {
  const lines = text.split('\n').map((l) => l.replace(/#.*/, '').trim());
  const entries: string[] = [];
  const lineNos: number[] = [];
  lines.forEach((l, i) => {
    if (l === '') return;
    entries.push(l);
    lineNos.push(i + 1);
  });
  const r = agentUsersSchema.safeParse(entries);
  if (r.success) return { ok: true, value: r.data };
  const bad = r.error.issues[0]?.path[0];
  return { ok: false, error: `line ${typeof bad === 'number' ? lineNos[bad] : '?'}: must be one user name or numeric UID` };
}

/** The file as `install --agent-user` writes it: a header saying what it is, then one entry per line. */
export function renderAgentUsers(existing: string | undefined, add: readonly string[]): string {
  const header =
    '# Local users whose agents may call the agent-connectors proxies (127.0.0.1:14323, :14324).\n' +
    '# One user name or numeric UID per line. root and the service user are always allowed.\n' +
    '# After editing: the proxies re-read it on their own (systemctl reload agent-connectors-forwarder\n# agent-connectors-cli-proxy also does).\n';
  const base = existing ?? header;
  const present = new Set(base.split('\n').map((l) => l.replace(/#.*/, '').trim()).filter(Boolean));
  const missing = add.filter((u) => !present.has(u));
  if (missing.length === 0) return base;
  return `${base}${base.endsWith('\n') || base === '' ? '' : '\n'}${missing.map((u) => `${u}\n`).join('')}`;
}

/** Far above any real list of users; a larger file is not one. */
const MAX_AGENT_USERS_BYTES = 1024 * 1024;

/**
 * Whether the file lets any agent in: `missing` or `empty` (no entry) means every agent gets
 * 403, the likeliest first-install mistake; `invalid` means the proxies keep their last good
 * list (none at their start). `ok` says nothing of whether the names exist.
 */
export type AgentUsersHealth = 'ok' | 'missing' | 'empty' | 'invalid';

export async function agentUsersHealth(path: string): Promise<AgentUsersHealth> {
  // stat, not lstat: the operator may keep the file elsewhere behind a symlink.
  const st = await stat(path).catch(() => undefined);
  if (!st) return 'missing';
  if (!st.isFile() || st.size > MAX_AGENT_USERS_BYTES) return 'invalid';
  const text = await readFile(path, 'utf8').catch(() => undefined);
  if (text === undefined) return 'invalid';
  const parsed = parseAgentUsers(text.slice(0, MAX_AGENT_USERS_BYTES));
  if (!parsed.ok) return 'invalid';
  return parsed.value.length === 0 ? 'empty' : 'ok';
}
