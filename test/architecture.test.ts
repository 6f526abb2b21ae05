import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

/**
 * The layering of src/, checked on the source text so a new import that breaks it fails
 * here, in a second, with the offending edge named. Lower layers never import higher ones;
 * within a layer, folders do not import each other (renew must not reach into cli-proxy).
 */
const SRC = resolve(dirname(fileURLToPath(import.meta.url)), '../../src');

const LAYERS: ReadonlyArray<readonly string[]> = [
  ['errors.ts', 'version.ts', 'net', 'fs', 'token', 'log'],
  ['data'],
  ['config', 'service'],
  ['http'],
  ['metrics'],
  ['forwarder', 'cli-proxy', 'apply', 'shims', 'doctor', 'install', 'link'],
  // One wiring of the parts (buildParts) and the flags that configure it.
  ['wiring'],
  ['cli'],
  // dev: the production wiring plus the demo Gateway; no product code imports it.
  ['dev'],
  ['cli.ts'],
];

function unitOf(file: string): string {
  return relative(SRC, file).split('/')[0] ?? '';
}

function layerOf(unit: string): number {
  const i = LAYERS.findIndex((l) => l.includes(unit));
  return i;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

const IMPORT = /(?:^|\n)\s*(?:import|export)[^'"\n]*?from\s*['"](\.{1,2}\/[^'"]+)['"]|import\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g;

function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const out: string[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const spec = m[1] ?? m[2];
    if (spec) out.push(resolve(dirname(file), spec.replace(/\.js$/, '.ts')));
  }
  return out;
}

const files = sourceFiles(SRC);
const graph = new Map(files.map((f) => [f, importsOf(f)]));

t.test('every src folder has a layer', async (t) => {
  const unknown = [...new Set(files.map(unitOf))].filter((u) => layerOf(u) < 0);
  t.same(unknown, [], 'add new folders to LAYERS in test/architecture.test.ts');
});

t.test('no import goes up a layer or sideways into another folder of the same layer', async (t) => {
  const bad: string[] = [];
  for (const [file, imports] of graph) {
    const from = unitOf(file);
    for (const target of imports) {
      const to = unitOf(target);
      if (from === to) continue;
      if (layerOf(to) >= layerOf(from)) bad.push(`${relative(SRC, file)} → ${relative(SRC, target)}`);
    }
  }
  t.same(bad, []);
});

t.test('no import cycle', async (t) => {
  const cycles: string[] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (f: string): void => {
    state.set(f, 'open');
    stack.push(f);
    for (const next of graph.get(f) ?? []) {
      if (!graph.has(next)) continue;
      const s = state.get(next);
      if (s === 'open') cycles.push(stack.slice(stack.indexOf(next)).concat(next).map((p) => relative(SRC, p)).join(' → '));
      else if (s === undefined) visit(next);
    }
    stack.pop();
    state.set(f, 'done');
  };
  for (const f of files) if (!state.has(f)) visit(f);
  t.same(cycles, []);
});

t.test('the checker sees imports (guards against a regex that matches nothing)', async (t) => {
  const cli = graph.get(join(SRC, 'cli.ts')) ?? [];
  t.ok(cli.includes(join(SRC, 'errors.ts')), 'cli.ts imports errors.ts');
  t.ok([...graph.values()].flat().length > 100, 'many edges found');
});
