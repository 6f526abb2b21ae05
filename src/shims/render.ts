import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Catalog } from '../data/catalog.js';
import { CA_BUNDLE_FILE } from '../data/state-layout.js';

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

/** The CA bundle variables the common runtimes read (OpenSSL, Node, Python requests, curl, git, the AWS SDKs). */
export const CA_BUNDLE_VARIABLES = ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO', 'AWS_CA_BUNDLE'] as const;

/**
 * What a `tls` provider's shim adds (SPEC §10): the cli-proxy as the HTTPS proxy and the
 * bundle (the system's CAs plus the CLI CA) wherever a runtime looks for one. Set after
 * the catalog's own variables, so a catalog cannot point them elsewhere.
 */
export function tlsModeEnv(proxyUrl: string, caBundle: string): Record<string, string> {
  const env: Record<string, string> = { HTTPS_PROXY: proxyUrl, https_proxy: proxyUrl };
  for (const name of CA_BUNDLE_VARIABLES) env[name] = caBundle;
  return env;
}

/**
 * One script per catalog command, from the one prototype in shims/. `{baseUrl}` is the
 * provider's path on the proxy, `{placeholder}` the provider's `placeholder` or the fixed
 * stand-in; nothing secret is ever written into a shim. `caBundle` (default: beside the
 * shims) is where `tls` providers' shims find the CA bundle the cli-proxy writes.
 */
export function renderShims(catalog: Catalog, shimDir: string, proxyUrl: string, caBundle = join(shimDir, CA_BUNDLE_FILE)): RenderedShim[] {
  const out: RenderedShim[] = [];
  const origin = proxyUrl.replace(/\/+$/, '');
  for (const [provider, p] of Object.entries(catalog)) {
    const baseUrl = `${origin}/p/${provider}`;
    const placeholder = p.placeholder ?? PLACEHOLDER;
    for (const cmd of p.commands) {
      const catalogEnv = Object.entries(cmd.env).map(([k, v]) => [k, v.split('{baseUrl}').join(baseUrl).split('{placeholder}').join(placeholder)] as const);
      const env = new Map<string, string>(catalogEnv);
      if (p.mode === 'tls') for (const [k, v] of Object.entries(tlsModeEnv(origin, caBundle))) env.set(k, v);
      const exports = [...env].map(([k, v]) => `${k}=${shQuote(v)}\nexport ${k}`).join('\n');
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
