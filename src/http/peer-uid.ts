import { readFile } from 'node:fs/promises';
import { isIPv4 } from 'node:net';

/** `/proc/net/tcp` encodes an IPv4 address as its bytes read as a little-endian u32. */
function hexV4(address: string): string {
  return address
    .split('.')
    .map((o) => Number(o).toString(16).padStart(2, '0'))
    .reverse()
    .join('')
    .toUpperCase();
}

/** `/proc/net/tcp6`: four 32-bit words, each little-endian. */
function hexV6(address: string): string {
  const parts = address.split('::');
  const head = parts[0] ? parts[0].split(':') : [];
  const tail = parts.length > 1 && parts[1] ? parts[1].split(':') : [];
  const groups = [...head, ...Array(8 - head.length - tail.length).fill('0'), ...tail].map((g) => g.padStart(4, '0'));
  const bytes = groups.join('').match(/../g) ?? [];
  let out = '';
  for (let w = 0; w < 4; w++) out += bytes.slice(w * 4, w * 4 + 4).reverse().join('');
  return out.toUpperCase();
}

function port16(port: number): string {
  return port.toString(16).toUpperCase().padStart(4, '0');
}

/**
 * Where the client's socket may be listed, and under which keys. An IPv4-mapped address
 * (a v6 listener reached over IPv4) means the client's own socket is an IPv4 one, listed
 * in /proc/net/tcp; an IPv6 client using a mapped address is listed in tcp6.
 */
function candidates(remote: string, remotePort: number, local: string, localPort: number): Array<{ file: string; client: string; server: string }> {
  const v4 = (a: string): string | undefined => (isIPv4(a) ? a : /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(a)?.[1]);
  const r4 = v4(remote);
  const l4 = v4(local);
  const out: Array<{ file: string; client: string; server: string }> = [];
  if (r4 && l4) out.push({ file: '/proc/net/tcp', client: `${hexV4(r4)}:${port16(remotePort)}`, server: `${hexV4(l4)}:${port16(localPort)}` });
  // Always also tcp6: an IPv6 client socket connected to ::ffff:127.0.0.1 (a JVM's
  // default) reaches an IPv4 listener but is listed only in tcp6, with mapped addresses.
  {
    const key6 = (a: string): string => (v4(a) ? `0000000000000000FFFF0000${hexV4(v4(a) as string)}` : hexV6(a));
    out.push({ file: '/proc/net/tcp6', client: `${key6(remote)}:${port16(remotePort)}`, server: `${key6(local)}:${port16(localPort)}` });
  }
  return out;
}

/**
 * The UID owning the other end of a loopback TCP connection: the kernel lists the
 * client's socket in /proc/net/tcp{,6} with our endpoint as its remote address and its
 * owner in the uid column. No shared secret is involved, so there is nothing for an agent
 * to leak. Undefined when the entry is gone (client already closed) or unreadable.
 */
export async function peerUid(remoteAddress: string, remotePort: number, localAddress: string, localPort: number, procRoot = ''): Promise<number | undefined> {
  for (const c of candidates(remoteAddress, remotePort, localAddress, localPort)) {
    // Asynchronous on purpose: the kernel walks its whole socket table to produce this
    // file (milliseconds on a busy host); that must not stall the event loop.
    let table: string;
    try {
      table = await readFile(procRoot + c.file, 'latin1');
    } catch {
      continue;
    }
    for (const line of table.split('\n')) {
      const cols = line.trim().split(/\s+/);
      if (cols[1] === c.client && cols[2] === c.server) {
        const uid = Number(cols[7]);
        return Number.isInteger(uid) ? uid : undefined;
      }
    }
  }
  return undefined;
}
