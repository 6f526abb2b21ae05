import type { HeaderRecord } from '../http/headers.js';
import type { Inject } from '../data/catalog.js';
import { AWS_SIGNATURE_HEADERS } from './aws-sigv4.js';

/** Credential headers an agent or CLI may send; always stripped before injection. */
export const AGENT_CREDENTIAL_HEADERS: readonly string[] = ['authorization', 'cookie', 'proxy-authorization'];

export function fill(template: string, token: string): string {
  return template.split('{token}').join(token);
}

/** The header names a request must lose before injection under `inject`. */
export function strippedHeaders(inject: Inject): Set<string> {
  // `expect`: node's server has already answered the CLI's `100-continue`, and undici
  // refuses to send the header (every PUT of `aws s3 cp` carried it and failed with 502).
  const names = new Set([...AGENT_CREDENTIAL_HEADERS, 'host', 'origin', 'referer', 'forwarded', 'expect']);
  if (inject.type === 'header') names.add(inject.name.toLowerCase());
  if (inject.type === 'aws-sigv4') for (const name of AWS_SIGNATURE_HEADERS) names.add(name);
  return names;
}

/**
 * Adds the real credential to an outgoing request, in place, as the catalog says. Pure
 * apart from mutating the given record and URL; the token goes nowhere else.
 */
export function injectToken(inject: Inject, token: string, headers: HeaderRecord, url: URL): void {
  switch (inject.type) {
    case 'header':
      headers[inject.name.toLowerCase()] = fill(inject.value, token);
      return;
    case 'query':
      url.search = withQueryParam(url.search, inject.name, token);
      return;
    case 'basic':
      headers.authorization = `Basic ${Buffer.from(basicCredential(inject, token)).toString('base64')}`;
      return;
    case 'aws-sigv4':
      // A signature covers the whole request and needs a hash: signAws (aws-sigv4.ts), async.
      throw new Error('aws-sigv4 is injected by signAws');
  }
}

/** The `user:password` pair a `basic` inject encodes, the token filled in. */
export function basicCredential(inject: Extract<Inject, { type: 'basic' }>, token: string): string {
  return `${fill(inject.username, token)}:${fill(inject.password, token)}`;
}

/** The raw query without any `name=` parameter; every other parameter byte for byte. */
function dropParam(query: string, name: string): string[] {
  return query.split('&').filter((pair) => {
    if (pair === '') return false;
    const key = pair.split('=', 1)[0] as string;
    let decoded: string;
    try {
      decoded = decodeURIComponent(key.replace(/\+/g, ' '));
    } catch {
      decoded = key;
    }
    return decoded !== name;
  });
}

/**
 * Replaces every `name=` parameter of a raw query with `name=<value>`, leaving all other
 * parameters byte for byte as the CLI sent them (URLSearchParams would re-encode them).
 */
export function withQueryParam(search: string, name: string, value: string): string {
  const kept = dropParam(search.startsWith('?') ? search.slice(1) : search, name);
  kept.push(`${encodeURIComponent(name)}=${encodeURIComponent(value)}`);
  return `?${kept.join('&')}`;
}

/** A URL (absolute or relative) without any `name=` query parameter. */
export function withoutQueryParam(location: string, name: string): string {
  const q = location.indexOf('?');
  if (q === -1) return location;
  const hash = location.indexOf('#', q);
  const query = location.slice(q + 1, hash === -1 ? undefined : hash);
  const rest = hash === -1 ? '' : location.slice(hash);
  const kept = dropParam(query, name);
  return `${location.slice(0, q)}${kept.length ? `?${kept.join('&')}` : ''}${rest}`;
}
