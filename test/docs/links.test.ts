import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import t from 'tap';
import { REPO_ROOT } from '../support/cli-proc.js';

/**
 * Every relative link in README.md and docs/ points at a file that exists, and every
 * anchor (`file.md#section`, `#section`) at a heading or an `<a id>` of that file. The
 * README is a front page that sends the reader into docs/, so a moved section must not
 * leave a link behind.
 */

function markdownFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? markdownFiles(join(dir, e.name)) : e.name.endsWith('.md') ? [join(dir, e.name)] : [],
  );
}

/** The text outside fenced code blocks and inline code: links there are not links. */
function prose(text: string): string {
  let fenced = false;
  return text
    .split('\n')
    .map((line) => {
      if (/^\s*(```|~~~)/.test(line)) {
        fenced = !fenced;
        return '';
      }
      return fenced ? '' : line.replace(/`[^`]*`/g, '');
    })
    .join('\n');
}

/** GitHub's anchors for a file's headings (lower case, punctuation dropped, spaces to '-', repeats numbered) and its `<a id>`s. */
function anchorsOf(text: string): Set<string> {
  const out = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    if (fenced) continue;
    const h = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (h) {
      const base = (h[1] ?? '')
        .toLowerCase()
        .replace(/[^\p{L}\p{N}\s_-]/gu, '')
        .replace(/\s/g, '-');
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      out.add(n === 0 ? base : `${base}-${n}`);
    }
    for (const a of line.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) out.add(a[1] as string);
  }
  return out;
}

const files = [resolve(REPO_ROOT, 'README.md'), ...markdownFiles(resolve(REPO_ROOT, 'docs'))];

t.test('the anchor rules match GitHub on the headings this repository uses', async (t) => {
  const a = anchorsOf('# Top\n## `doctor --json`\n## Decisions (where SPEC §9 is silent)\n## doctor\'s checks\n## Top\n```\n## not a heading\n```\n<a id="desired-state"></a>');
  t.same([...a].sort(), ['decisions-where-spec-9-is-silent', 'desired-state', 'doctor---json', 'doctors-checks', 'top', 'top-1'].sort());
});

t.test('every relative link in README.md and docs/ resolves', async (t) => {
  t.ok(files.length > 10, `${files.length} markdown files`);
  let checked = 0;
  for (const file of files) {
    const name = relative(REPO_ROOT, file);
    const text = readFileSync(file, 'utf8');
    for (const m of prose(text).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      const target = m[1] as string;
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto: …
      checked++;
      const [path = '', anchor] = target.split('#', 2);
      const dest = path === '' ? file : resolve(dirname(file), decodeURIComponent(path));
      if (!existsSync(dest)) {
        t.fail(`${name}: link to ${target}: ${relative(REPO_ROOT, dest)} does not exist`);
        continue;
      }
      if (anchor === undefined) continue;
      if (statSync(dest).isDirectory() || !dest.endsWith('.md')) {
        t.fail(`${name}: link to ${target}: an anchor into something that is not a markdown file`);
        continue;
      }
      if (!anchorsOf(readFileSync(dest, 'utf8')).has(anchor)) t.fail(`${name}: link to ${target}: no heading or <a id> "${anchor}" in ${relative(REPO_ROOT, dest)}`);
    }
  }
  t.ok(checked > 100, `${checked} relative links checked`);
});
