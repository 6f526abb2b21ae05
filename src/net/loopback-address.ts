import { isIP } from 'node:net';

/**
 * What counts as loopback, in one leaf module: the data layer (which upstream URLs may be
 * plain http:) and the servers (which listen addresses, Host and Origin values pass) both
 * ask it, and it asks nothing of ours.
 */

/** 127.0.0.0/8, ::1 and the IPv4-mapped forms of 127/8. */
export function isLoopbackAddress(address: string): boolean {
  const bare = address.startsWith('[') && address.endsWith(']') ? address.slice(1, -1) : address;
  const kind = isIP(bare);
  if (kind === 4) return bare.startsWith('127.');
  if (kind === 6) {
    const lower = bare.toLowerCase();
    if (lower === '::1' || lower === '0:0:0:0:0:0:0:1') return true;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
    return mapped?.[1] !== undefined && mapped[1].startsWith('127.');
  }
  return false;
}

/** A loopback host name as it may appear in a URL: localhost or a loopback IP literal. */
export function isLoopbackHostname(hostname: string): boolean {
  const lower = hostname.toLowerCase();
  return lower === 'localhost' || isLoopbackAddress(lower);
}
