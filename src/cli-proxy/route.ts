import { PROVIDER_NAME } from '../data/catalog.js';

export type CliRoute =
  | { kind: 'health' }
  | { kind: 'provider'; provider: string; rest: string; search: string }
  | { kind: 'unknown_provider' }
  | { kind: 'not_found' };

/** `/p/<provider>/<rest>?<query>`: rest and query are kept raw, exactly as the CLI sent them. */
export function routeCli(target: string | undefined): CliRoute {
  if (!target?.startsWith('/')) return { kind: 'not_found' };
  const q = target.indexOf('?');
  const path = q === -1 ? target : target.slice(0, q);
  const search = q === -1 ? '' : target.slice(q);
  if (path === '/healthz') return { kind: 'health' };
  const m = /^\/p\/([^/]+)(\/.*)?$/.exec(path);
  if (!m?.[1]) return { kind: 'not_found' };
  if (!PROVIDER_NAME.test(m[1])) return { kind: 'unknown_provider' };
  return { kind: 'provider', provider: m[1], rest: m[2] ?? '', search };
}

/** The upstream URL: the catalog's base (its path kept) + the CLI's path and query. */
export function upstreamUrl(base: string, rest: string, search: string): URL {
  const url = new URL(base);
  const basePath = url.pathname.replace(/\/+$/, '');
  // Assigning pathname would re-encode; build the string so the CLI's bytes pass unchanged.
  return new URL(`${url.origin}${basePath}${rest || (basePath ? '' : '/')}${search}`);
}

/**
 * A redirect to the upstream itself is rewritten to go through the proxy again (the CLI
 * would otherwise call the upstream directly, with only its placeholder); any other
 * Location passes unchanged and is never followed by us.
 */
export function rewriteLocation(location: string, requestUrl: URL, base: string, proxyBase: string): string {
  let target: URL;
  try {
    target = new URL(location, requestUrl);
  } catch {
    return location;
  }
  const baseUrl = new URL(base);
  const basePath = baseUrl.pathname.replace(/\/+$/, '');
  if (target.origin !== baseUrl.origin || !(target.pathname === basePath || target.pathname.startsWith(`${basePath}/`))) return location;
  return `${proxyBase}${target.pathname.slice(basePath.length)}${target.search}${target.hash}`;
}

/**
 * Each URI reference of a `Link` value (`<uri>; rel="next", <uri>; rel="last"`) through
 * `rewrite`, the parameters kept byte for byte: pagination links get the treatment a
 * Location gets, so `gh api --paginate` and the like keep going through the proxy.
 */
export function rewriteLinkHeader(value: string, rewrite: (uri: string) => string): string {
  return value.replace(/<([^>]*)>/g, (_, uri: string) => `<${rewrite(uri)}>`);
}
