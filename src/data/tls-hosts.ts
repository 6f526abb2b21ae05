import { isIP } from 'node:net';
import { z } from 'zod';

/**
 * The host names of TLS-mode providers (SPEC §10): which hosts the cli-proxy intercepts,
 * mints certificates for and injects a token into. A catalog is data from the Gateway,
 * so what it may name is narrow: lower-case DNS names, a `*.` wildcard for exactly one
 * label (over at least two labels, so never `*.com`), no IP address, no `localhost`, and
 * no host claimed by two providers (which token would it get?).
 */

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;
export const MAX_HOSTS_PER_PROVIDER = 64;

/** Why `entry` cannot be a `hosts` entry, or undefined if it can. */
export function hostEntryProblem(entry: string): string | undefined {
  if (entry.length > 253) return 'longer than 253 characters';
  if (isIP(entry.replace(/^\[|\]$/g, '')) !== 0) return 'an IP address';
  const wildcard = entry.startsWith('*.');
  const labels = (wildcard ? entry.slice(2) : entry).split('.');
  if (labels.includes('localhost')) return 'localhost';
  if (labels.some((l) => l.includes('*'))) return 'a wildcard wider than one label (only a leading "*." is allowed)';
  if (!labels.every((l) => LABEL.test(l))) return 'not a lower-case DNS name';
  if (labels.length < 2) return wildcard ? 'a wildcard over a top-level domain' : 'not a fully qualified name';
  // All-numeric last label: an IPv4 address in another spelling (`127.1`, `0x7f.1`), or no real TLD.
  if (/^[0-9]+$/.test(labels[labels.length - 1] as string)) return 'a numeric top-level label';
  return undefined;
}

export const hostEntrySchema = z.string().superRefine((value, ctx) => {
  const problem = hostEntryProblem(value);
  if (problem !== undefined) ctx.addIssue({ code: 'custom', message: `hosts entry is ${problem}` });
});

export const hostsSchema = z.array(hostEntrySchema).min(1, 'a tls provider needs at least one host').max(MAX_HOSTS_PER_PROVIDER, `at most ${MAX_HOSTS_PER_PROVIDER} hosts`);

/** Whether a catalog `hosts` entry covers `host` (lower case, no trailing dot). */
export function hostMatches(entry: string, host: string): boolean {
  if (!entry.startsWith('*.')) return entry === host;
  const suffix = entry.slice(1); // `.example.com`
  return host.endsWith(suffix) && host.length > suffix.length && !host.slice(0, -suffix.length).includes('.');
}

interface TlsProviderLike {
  mode?: string | undefined;
  hosts?: readonly string[] | undefined;
}

/**
 * Two providers claiming one host: the same entry twice, or an exact name one provider
 * lists that another's wildcard covers. Returns a message naming the host, or undefined.
 */
export function overlappingHost(providers: Record<string, TlsProviderLike>): string | undefined {
  const claims: Array<{ provider: string; entry: string }> = [];
  for (const [provider, p] of Object.entries(providers)) {
    if (p.mode !== 'tls') continue;
    for (const entry of new Set(p.hosts ?? [])) claims.push({ provider, entry });
  }
  for (let i = 0; i < claims.length; i++) {
    for (let j = i + 1; j < claims.length; j++) {
      const a = claims[i] as (typeof claims)[number];
      const b = claims[j] as (typeof claims)[number];
      if (a.provider === b.provider) continue;
      if (a.entry === b.entry || hostMatches(a.entry, b.entry) || hostMatches(b.entry, a.entry)) {
        return `host "${a.entry === b.entry ? a.entry : `${a.entry}" / "${b.entry}`}" is named by two providers`;
      }
    }
  }
  return undefined;
}

/**
 * The provider of a TLS-mode catalog that covers `host` (case and one trailing dot
 * ignored), exact names before wildcards; undefined: not a catalog host, so tunnelled.
 */
export function tlsProviderFor<P extends TlsProviderLike>(providers: Record<string, P>, host: string): { name: string; provider: P } | undefined {
  const wanted = host.toLowerCase().replace(/\.$/, '');
  let wild: { name: string; provider: P } | undefined;
  for (const [name, provider] of Object.entries(providers)) {
    if (provider.mode !== 'tls') continue;
    for (const entry of provider.hosts ?? []) {
      if (entry === wanted) return { name, provider };
      if (wild === undefined && hostMatches(entry, wanted)) wild = { name, provider };
    }
  }
  return wild;
}

/** A per-provider stand-in credential in the format its CLI checks: printable ASCII, no space. */
export const placeholderSchema = z.string().regex(/^[\x21-\x7e]{1,256}$/, 'placeholder must be 1-256 printable ASCII characters without spaces');

/**
 * What a catalog may not do in TLS mode, over all its providers: a field of the other
 * mode, a `tls` provider without hosts, one host claimed twice. Undefined: none of these.
 */
export function tlsCatalogProblem(providers: Record<string, TlsProviderLike & { upstream?: string | undefined }>): string | undefined {
  for (const [name, p] of Object.entries(providers)) {
    if (p.mode === 'tls') {
      if (p.upstream !== undefined) return `provider "${name}": a tls provider has hosts, not upstream`;
      if (p.hosts === undefined) return `provider "${name}": a tls provider needs hosts`;
    } else {
      if (p.hosts !== undefined) return `provider "${name}": hosts belong to mode "tls"`;
      if (p.upstream === undefined) return `provider "${name}": upstream is required (or mode "tls" with hosts)`;
    }
  }
  return overlappingHost(providers);
}
