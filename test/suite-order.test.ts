import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { REPO_ROOT } from './support/cli-proc.js';

/**
 * tap starts test files in name order (@tapjs/run sorts them with localeCompare 'en') and
 * runs two at a time (.taprc jobs: 2). The systemd labs file takes minutes, far longer
 * than any other: started last, it alone would run on after everything else is done, so
 * its name sorts first and it runs beside the rest (docs/testing.md). A new file whose
 * name sorts before it would quietly undo that; this says so instead.
 */
const LABS = 'build/contract-tests/0-systemd-labs.test.js';

/** The compiled path of every test source under `dir`, as the include globs of .taprc match them. */
function testFiles(dir: string): string[] {
  return readdirSync(join(REPO_ROOT, dir), { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.test.ts'))
    .map((f) => `build/${dir}/${f.replace(/\.ts$/, '.js')}`);
}

t.test('the systemd labs file is the first tap starts', async (t) => {
  const include = readFileSync(join(REPO_ROOT, '.taprc'), 'utf8');
  t.match(include, /^ {2}- "build\/test\/\*\*\/\*\.test\.js"$/m, '.taprc includes build/test');
  t.match(include, /^ {2}- "build\/contract-tests\/\*\*\/\*\.test\.js"$/m, 'and build/contract-tests, nothing else this test does not list');
  const files = [...testFiles('contract-tests'), ...testFiles('test')].sort((a, b) => a.localeCompare(b, 'en'));
  t.ok(files.includes(LABS), `${LABS} is a test file`);
  t.equal(files[0], LABS, `tap's order starts with the labs file (then ${files.slice(1, 3).join(', ')})`);
});
