import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import { CLI, REPO_ROOT } from '../support/cli-proc.js';

/**
 * docs/cli.md is the reference of every command and option: each command `--help` lists
 * has a section "## `<command>`" naming each of its options, and the page names no command
 * or option the CLI does not have. An alias section ("Alias of [`link`](#link)") is checked
 * against the section it points to.
 */

const execFileP = promisify(execFile);

interface Help {
  options: string[];
  commands: string[];
}

/** `--help` of one command, as an operator would run it (tap's NODE_OPTIONS loaders left out). */
async function helpOf(path: readonly string[]): Promise<Help> {
  const env = { ...process.env };
  delete env.NODE_OPTIONS;
  const { stdout } = await execFileP(process.execPath, [CLI, ...path, '--help'], { env });
  const options: string[] = [];
  const commands: string[] = [];
  let part = '';
  for (const line of stdout.split('\n')) {
    if (/^\S.*:$/.test(line)) part = line;
    const item = /^ {2}(?:-[A-Za-z], )?(\S+)/.exec(line);
    if (!item) continue;
    if (part === 'Options:') {
      const flag = item[1] ?? '';
      if (flag.startsWith('--') && flag !== '--help' && flag !== '--version') options.push(flag);
    } else if (part === 'Commands:' && item[1] !== 'help') commands.push(item[1] as string);
  }
  return { options, commands };
}

/** `helpOf` for each path, two CLI starts at a time (the machine has two cores). */
async function helpsOf(paths: readonly string[][]): Promise<Array<{ path: string[]; help: Help }>> {
  const out: Array<{ path: string[]; help: Help }> = [];
  let next = 0;
  const worker = async (): Promise<void> => {
    for (let i = next++; i < paths.length; i = next++) out[i] = { path: paths[i] as string[], help: await helpOf(paths[i] as string[]) };
  };
  await Promise.all([worker(), worker()]);
  return out;
}

/** The sections of docs/cli.md that document a command, by command. */
function sections(doc: string): Map<string, string> {
  const out = new Map<string, string>();
  const parts = doc.split(/^## /m).slice(1);
  for (const p of parts) {
    const name = /^`([^`]+)`\n/.exec(p)?.[1];
    if (name) out.set(name, p);
  }
  return out;
}

const optionsNamed = (section: string): Set<string> => new Set([...section.matchAll(/^\| `(--[a-z0-9-]+)/gm)].map((m) => m[1] as string));

t.test('docs/cli.md documents every command and option, and nothing else', async (t) => {
  const doc = sections(readFileSync(resolve(REPO_ROOT, 'docs/cli.md'), 'utf8'));
  const seen = new Set<string>();
  // Level by level: the commands `--help` lists, then theirs.
  let level: string[][] = [[]];
  while (level.length > 0) {
    const helps = await helpsOf(level);
    for (const { path, help } of helps) {
      const name = path.join(' ');
      // A pure group (`renew`, `shims`) has no options of its own: its commands carry them.
      if (path.length === 0 || (help.options.length === 0 && help.commands.length > 0)) continue;
      seen.add(name);
      let section = doc.get(name);
      if (section === undefined) {
        t.fail(`docs/cli.md has no section "## \`${name}\`"`);
        continue;
      }
      const alias = /Alias of \[`([^`]+)`\]/.exec(section)?.[1];
      if (alias !== undefined) section = doc.get(alias) ?? '';
      const named = optionsNamed(section);
      t.same(help.options.filter((o) => !named.has(o)), [], `${name}: every option is in docs/cli.md${alias ? ` (under ${alias})` : ''}`);
      t.same([...named].filter((o) => !help.options.includes(o)), [], `${name}: docs/cli.md names no option it does not have`);
    }
    level = helps.flatMap(({ path, help }) => help.commands.map((c) => [...path, c]));
  }
  t.ok(seen.size >= 15, `${seen.size} commands checked`);
  t.same([...doc.keys()].filter((k) => !seen.has(k)), [], 'every command section of docs/cli.md is a command the CLI has');
});
