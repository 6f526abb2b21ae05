import { readFileSync } from 'node:fs';
import type { Catalog } from '../data/catalog.js';
import { COMMAND_NAME, envNameProblem } from '../data/catalog-rules.js';

/** A fixed, non-secret stand-in for the credential a CLI insists on having. */
export const PLACEHOLDER = 'agent-connectors-placeholder';
export const SHIM_MARKER = '# agent-connectors-shim:';

const template = readFileSync(new URL('../../shims/shim.sh.in', import.meta.url), 'utf8');

/** Single-quotes a value for POSIX sh: nothing inside is expanded. */
export function shQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

export interface RenderedShim {
  name: string;
  provider: string;
  script: string;
}

/**
 * One script per catalog command, from the one prototype in shims/. `{baseUrl}` is the
 * provider's path on the proxy, `{placeholder}` the fixed stand-in; nothing secret is
 * ever written into a shim.
 */
export function renderShims(catalog: Catalog, shimDir: string, proxyUrl: string): RenderedShim[] {
  const out: RenderedShim[] = [];
  for (const [provider, p] of Object.entries(catalog)) {
    const baseUrl = `${proxyUrl.replace(/\/+$/, '')}/p/${provider}`;
    for (const cmd of p.commands) {
      // The schemas hold these rules; checked again where they become a file and a script,
      // so no caller can render what a catalog may not say.
      const badEnv = Object.keys(cmd.env).find((k) => envNameProblem(k) !== undefined);
      if (!COMMAND_NAME.test(cmd.name) || badEnv !== undefined) throw new Error(`provider ${provider}: a command or environment name breaks the catalog rules`);
      // One `NAME='value'` word per line, for env(1): the name passed the catalog's
      // rules (a plain upper-case name), the value is single-quoted, so the shell sees
      // literal words and assigns none of its own variables.
      const envWords = Object.entries(cmd.env)
        .map(([k, v]) => ` \\\n  ${k}=${shQuote(v.split('{baseUrl}').join(baseUrl).split('{placeholder}').join(PLACEHOLDER))}`)
        .join('');
      const script = template
        .split('@NAME@')
        .join(cmd.name)
        .split('@PROVIDER@')
        .join(provider)
        // Replacer functions: a string replacement would interpret `$$`, `$&`… in catalog values.
        .replace('@SHIM_DIR@', () => shQuote(shimDir))
        .replace('@ENV@', () => (envWords === '' ? '' : `${envWords} \\\n `));
      out.push({ name: cmd.name, provider, script });
    }
  }
  return out;
}
