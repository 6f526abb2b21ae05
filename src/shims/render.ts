import { readFileSync } from 'node:fs';
import { MAX_ARG_LENGTH, MAX_ARGS, type Catalog } from '../data/catalog.js';
import { COMMAND_NAME, envNameProblem, LINE_BREAK_OR_NUL } from '../data/catalog-rules.js';

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
 * The CA bundle variables the common runtimes read (OpenSSL and Go, Node, Python requests
 * and botocore, curl, git). Not `AWS_CA_BUNDLE`: the AWS CLI's botocore reads
 * `REQUESTS_CA_BUNDLE`, Go's SDKs the system roots (`SSL_CERT_FILE`), and aws-sdk-go v1
 * fails outright with it set when its caller brings its own HTTP transport (rclone:
 * "LoadCustomCABundleError: … HTTPClient's transport unsupported type").
 */
export const CA_BUNDLE_VARIABLES = ['SSL_CERT_FILE', 'NODE_EXTRA_CA_CERTS', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'GIT_SSL_CAINFO'] as const;

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
 * provider's path on the proxy, or its own port's origin when it has one (a CLI that drops
 * the path keeps working), `{placeholder}` the provider's `placeholder` or the fixed
 * stand-in; nothing secret is ever written into a shim. `caBundle` is where `tls` providers' shims find the CA bundle the cli-proxy writes.
 */
export function renderShims(catalog: Catalog, shimDir: string, proxyUrl: string, caBundle: string): RenderedShim[] {
  const out: RenderedShim[] = [];
  const origin = proxyUrl.replace(/\/+$/, '');
  for (const [provider, p] of Object.entries(catalog)) {
    const baseUrl = p.port === undefined ? `${origin}/p/${provider}` : `http://127.0.0.1:${p.port}`;
    const placeholder = p.placeholder ?? PLACEHOLDER;
    const expand = (v: string): string => v.split('{baseUrl}').join(baseUrl).split('{placeholder}').join(placeholder);
    for (const cmd of p.commands) {
      // The schemas hold these rules; checked again where they become a file and a script,
      // so no caller can render what a catalog may not say.
      const badEnv = Object.keys(cmd.env).find((k) => envNameProblem(k) !== undefined);
      if (!COMMAND_NAME.test(cmd.name) || badEnv !== undefined) throw new Error(`provider ${provider}: a command or environment name breaks the catalog rules`);
      const args = cmd.args ?? [];
      if (args.length > MAX_ARGS || args.some((a) => a.length > MAX_ARG_LENGTH || LINE_BREAK_OR_NUL.test(a))) throw new Error(`provider ${provider}: an argument breaks the catalog rules`);
      const env = new Map<string, string>(Object.entries(cmd.env).map(([k, v]) => [k, expand(v)]));
      // TLS mode's own variables go last: a catalog cannot point them elsewhere.
      if (p.mode === 'tls') for (const [k, v] of Object.entries(tlsModeEnv(origin, caBundle))) env.set(k, v);
      // One `NAME='value'` word per line, for env(1): each name passed the catalog's rules
      // or is the shim's own, each value is single-quoted, so the shell sees literal words
      // and assigns none of its own variables.
      const envWords = [...env].map(([k, v]) => ` \\\n  ${k}=${shQuote(v)}`).join('');
      const script = template
        .split('@NAME@')
        .join(cmd.name)
        .split('@PROVIDER@')
        .join(provider)
        // Replacer functions: a string replacement would interpret `$$`, `$&`… in catalog values.
        .replace('@SHIM_DIR@', () => shQuote(shimDir))
        .replace('@ENV@', () => (envWords === '' ? '' : `${envWords} \\\n `))
        // Each arg one single-quoted word between the real command and the agent's own "$@".
        .replace('@ARGS@', () => args.map((a) => ` ${shQuote(expand(a))}`).join(''));
      out.push({ name: cmd.name, provider, script });
    }
  }
  return out;
}
