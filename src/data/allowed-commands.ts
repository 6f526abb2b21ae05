import { ConfigError } from '../errors.js';
import { readBoundedRegularFile, UnsafeFileError } from '../fs/bounded-read.js';
import { COMMAND_NAME } from './catalog-rules.js';
import type { ParseResult } from './parse.js';

/**
 * /etc/agent-connectors/allowed-commands: the host tools (catalog-rules.ts's deny list)
 * the operator lets a catalog shim anyway. One command name per line; `#` starts a
 * comment; blank lines are ignored. Only the operator writes it: it must be a regular
 * file owned by root and writable by nobody else, or it is refused (then nothing is
 * allowed). The Gateway cannot touch it: it is not in any directory apply or the link
 * writes.
 */
export const ALLOWED_COMMANDS_FILE = '/etc/agent-connectors/allowed-commands';

/** Far more than any operator lists; a bound on what is read. */
const MAX_BYTES = 64 * 1024;

/** The names, or the first bad line (its number, never its text). */
export function parseAllowedCommands(text: string): ParseResult<Set<string>> {
  const names = new Set<string>();
  const lines = text.split('\n');
  for (const [i, raw] of lines.entries()) {
    const line = raw.replace(/#.*/, '').trim();
    if (line === '') continue;
    if (!COMMAND_NAME.test(line)) return { ok: false, error: `line ${i + 1}: must be one plain command name` };
    names.add(line);
  }
  return { ok: true, value: names };
}

/**
 * The operator's allowed names. Missing → none. A file that is not root's alone, not a
 * regular file, or has a bad line → ConfigError (the caller decides: `shims install`
 * exits 2, apply logs it and allows nothing).
 */
export async function readAllowedCommands(path: string): Promise<Set<string>> {
  let file;
  try {
    file = await readBoundedRegularFile(path, MAX_BYTES);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return new Set();
    if (err instanceof UnsafeFileError) throw new ConfigError(`${err.message}; the allowed-commands file is ignored`);
    throw err;
  }
  if (file.stat.uid !== 0 || (file.stat.mode & 0o022) !== 0) {
    throw new ConfigError(`${path} must be owned by root and writable by root alone (chown root: ${path}; chmod 644 ${path}); it is ignored`);
  }
  const parsed = parseAllowedCommands(file.text);
  if (!parsed.ok) throw new ConfigError(`${path} is invalid (${parsed.error}); it is ignored`);
  return parsed.value;
}
