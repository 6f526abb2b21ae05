import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { connect, createServer, isIPv4, type AddressInfo } from 'node:net';
import { SockDiagHelper, type OverloadEvent } from './sock-diag-helper.js';

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
 * The UID owning the other end of a loopback TCP connection, by reading the whole socket
 * table: the fallback when `ss` is not usable. The kernel lists the
 * client's socket in /proc/net/tcp{,6} with our endpoint as its remote address and its
 * owner in the uid column. No shared secret is involved, so there is nothing for an agent
 * to leak. Undefined when the entry is gone (client already closed) or unreadable.
 */
export async function peerUid(remoteAddress: string, remotePort: number, localAddress: string, localPort: number, procRoot = '', established = false): Promise<number | undefined> {
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
      // st 01 is ESTABLISHED (see SockDiagHelper.lookup for why a listener check needs it).
      if (cols[1] === c.client && cols[2] === c.server && (!established || cols[3] === '01')) {
        const uid = Number(cols[7]);
        return Number.isInteger(uid) ? uid : undefined;
      }
    }
  }
  return undefined;
}

/** An address as `ss` filters take it; a mapped v4 address as plain v4 (the kernel's filter also matches v4-mapped sockets with it). */
function ssEndpoint(address: string, port: number): string {
  const v4 = isIPv4(address) ? address : /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
  return v4 ? `${v4}:${port}` : `[${address}]:${port}`;
}

/** Bounds what one lookup may cost or return: a filter on a 4-tuple matches one socket. */
const SS_TIMEOUT_MS = 5_000;
const SS_MAX_OUTPUT = 64 * 1024;

/**
 * The same answer from the kernel's sock_diag interface, through `ss` (iproute2): the
 * 4-tuple filter is compiled to inet_diag bytecode that runs in the kernel, so only the
 * client's socket is formatted and copied out, whatever the host's socket count (see
 * docs/access.md for the figures). Node cannot open AF_NETLINK itself, hence the child.
 *
 * `ss -e` prints `uid:N` only for a non-zero owner, so a matched line without it is root;
 * `ino:` (always printed with -e) proves the details were printed at all. Undefined when
 * no socket matched, or ss failed (both refuse the connection).
 */
export function peerUidBySs(remoteAddress: string, remotePort: number, localAddress: string, localPort: number, ss = 'ss', established = false): Promise<number | undefined> {
  const args = ['-tnHe', 'state', established ? 'established' : 'connected', 'src', ssEndpoint(remoteAddress, remotePort), 'dst', ssEndpoint(localAddress, localPort)];
  return new Promise((resolve) => {
    execFile(ss, args, { env: {}, timeout: SS_TIMEOUT_MS, maxBuffer: SS_MAX_OUTPUT, encoding: 'latin1' }, (err, stdout) => {
      if (err) {
        resolve(undefined);
        return;
      }
      const line = stdout.split('\n').find((l) => / ino:\d+/.test(l));
      if (!line) {
        resolve(undefined);
        return;
      }
      const uid = / uid:(\d+)/.exec(line)?.[1];
      resolve(uid === undefined ? 0 : Number(uid));
    });
  });
}

export type PeerUidLookup = (remoteAddress: string, remotePort: number, localAddress: string, localPort: number) => Promise<number | undefined>;

export type PeerUidMethod = 'sock_diag' | 'ss' | 'procfs';

/** The chosen method, for both directions. */
export interface PeerUidLookups {
  /** The owner of a connection we accepted (the client's process). */
  lookup: PeerUidLookup;
  /** The owner of the listener a connection we made reached (its accepted socket, ESTABLISHED only). */
  listenerOwner: PeerUidLookup;
  method: PeerUidMethod;
  skipped: Partial<Record<PeerUidMethod, string>>;
  close: () => void;
}

/** Answers `lookup` for a loopback connection of our own: our UID, or why not. */
async function selfCheck(lookup: PeerUidLookup): Promise<string | undefined> {
  const server = createServer((s) => s.on('error', () => undefined));
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', resolve);
    });
    const port = (server.address() as AddressInfo).port;
    const client = connect(port, '127.0.0.1');
    try {
      await new Promise<void>((resolve, reject) => {
        client.once('connect', resolve);
        client.once('error', reject);
      });
      const uid = await lookup('127.0.0.1', client.localPort ?? 0, '127.0.0.1', port);
      const own = process.getuid?.();
      if (uid !== undefined && uid === own) return undefined;
      return uid === undefined ? 'no answer' : `reported uid ${uid}, not ours (${own ?? '?'})`;
    } finally {
      client.destroy();
    }
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  } finally {
    server.close();
  }
}

/**
 * Picks the lookup once, at start, in order of cost: the sock_diag helper (constant cost),
 * `ss` per connection, then the /proc/net/tcp reader. A method is taken only if it answers
 * for a connection of our own with our own UID (which also catches one that reads every
 * owner as root). `skipped` says why the cheaper ones were not taken.
 */
export async function choosePeerUidLookup(opts: { perl?: string; ss?: string; onOverload?: (event: OverloadEvent) => void } = {}): Promise<PeerUidLookups> {
  const skipped: Partial<Record<PeerUidMethod, string>> = {};
  const helper = new SockDiagHelper({ ...(opts.perl === undefined ? {} : { perl: opts.perl }), onOverload: opts.onOverload });
  const viaHelper: PeerUidLookup = (...a) => helper.lookup(...a);
  const helperWhy = await selfCheck(viaHelper);
  if (helperWhy === undefined) {
    return { lookup: viaHelper, listenerOwner: (...a) => helper.lookup(...a, true), method: 'sock_diag', skipped, close: () => helper.close() };
  }
  helper.close();
  skipped.sock_diag = `perl sock_diag helper: ${helperWhy}`;
  const viaSs: PeerUidLookup = (...a) => peerUidBySs(...a, opts.ss);
  const ssWhy = await selfCheck(viaSs);
  if (ssWhy === undefined) return { lookup: viaSs, listenerOwner: (...a) => peerUidBySs(...a, opts.ss, true), method: 'ss', skipped, close: () => undefined };
  skipped.ss = `ss: ${ssWhy}`;
  return { lookup: (...a) => peerUid(...a), listenerOwner: (...a) => peerUid(...a, '', true), method: 'procfs', skipped, close: () => undefined };
}

/**
 * The choice made on first use and shared: one helper process answers both the inbound
 * peer check and the upstream guard. `close` ends it whenever it was started.
 */
export function sharedPeerUidLookups(opts: Parameters<typeof choosePeerUidLookup>[0] = {}): { get: () => Promise<PeerUidLookups>; close: () => Promise<void> } {
  let chosen: Promise<PeerUidLookups> | undefined;
  return {
    get: () => (chosen ??= choosePeerUidLookup(opts)),
    close: async () => {
      (await chosen)?.close();
    },
  };
}
