import { readFileSync } from 'node:fs';
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

function endpoint(address: string, port: number): { file: string; key: string } {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
  const port16 = port.toString(16).toUpperCase().padStart(4, '0');
  if (isIPv4(address)) return { file: '/proc/net/tcp', key: `${hexV4(address)}:${port16}` };
  if (mapped) return { file: '/proc/net/tcp6', key: `0000000000000000FFFF0000${hexV4(mapped)}:${port16}` };
  return { file: '/proc/net/tcp6', key: `${hexV6(address)}:${port16}` };
}

/**
 * The UID owning the other end of a loopback TCP connection: the kernel lists the
 * client's socket in /proc/net/tcp{,6} with our endpoint as its remote address and its
 * owner in the uid column. No shared secret is involved, so there is nothing for an agent
 * to leak. Undefined when the entry is gone (client already closed) or unreadable.
 */
export function peerUid(remoteAddress: string, remotePort: number, localAddress: string, localPort: number, procRoot = ''): number | undefined {
  const client = endpoint(remoteAddress, remotePort);
  const server = endpoint(localAddress, localPort);
  let table: string;
  try {
    table = readFileSync(procRoot + client.file, 'latin1');
  } catch {
    return undefined;
  }
  for (const line of table.split('\n')) {
    const cols = line.trim().split(/\s+/);
    if (cols[1] === client.key && cols[2] === server.key) {
      const uid = Number(cols[7]);
      return Number.isInteger(uid) ? uid : undefined;
    }
  }
  return undefined;
}
