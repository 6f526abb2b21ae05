import { readFileSync } from 'node:fs';
import type { Catalog } from '../data/catalog.js';

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
      const exports = Object.entries(cmd.env)
        .map(([k, v]) => `${k}=${shQuote(v.split('{baseUrl}').join(baseUrl).split('{placeholder}').join(PLACEHOLDER))}\nexport ${k}`)
        .join('\n');
      const script = template
        .split('@NAME@')
        .join(cmd.name)
        .split('@PROVIDER@')
        .join(provider)
        // Replacer functions: a string replacement would interpret `$$`, `$&`… in catalog values.
        .replace('@SHIM_DIR@', () => shQuote(shimDir))
        .replace('@EXPORTS@', () => exports);
      out.push({ name: cmd.name, provider, script });
    }
  }
  return out;
}
