import { ConfigError } from '../errors.js';
import { isLoopbackAddress, isLoopbackHostname } from '../net/loopback-address.js';

export type Check = { ok: true } | { ok: false; reason: string };

const OK: Check = { ok: true };

export interface ListenAddress {
  host: string;
  port: number;
}

/** Parses `--listen HOST:PORT` (IPv6 as `[::1]:PORT`) and refuses anything not on loopback. */
export function parseListen(value: string, flag = '--listen'): ListenAddress {
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(value.trim());
  if (!m?.[1] || !m[2]) throw new ConfigError(`${flag} must be HOST:PORT, got "${value}"`);
  const port = Number(m[2]);
  if (port > 65535) throw new ConfigError(`${flag} port out of range: ${port}`);
  const host = m[1].startsWith('[') ? m[1].slice(1, -1) : m[1];
  if (host.toLowerCase() === 'localhost') return { host: '127.0.0.1', port };
  if (!isLoopbackAddress(host)) {
    throw new ConfigError(`${flag} must be a loopback address (127.0.0.0/8 or ::1); refusing "${host}"`);
  }
  return { host, port };
}

/**
 * DNS-rebinding defence: a page on evil.example resolving to 127.0.0.1 still sends its own
 * name in Host, so only loopback names with our exact port are accepted.
 */
export function checkHost(hostHeader: string | undefined, port: number): Check {
  // Every request of a client names the same Host: the last answer, kept, spares the
  // match (an array and its strings per request). A pure function's answer, by value.
  if (hostHeader === lastHost && port === lastPort && lastCheck !== undefined) return lastCheck;
  const check = hostCheck(hostHeader, port);
  lastHost = hostHeader;
  lastPort = port;
  lastCheck = check;
  return check;
}

let lastHost: string | undefined;
let lastPort = -1;
let lastCheck: Check | undefined;

function hostCheck(hostHeader: string | undefined, port: number): Check {
  if (!hostHeader) return { ok: false, reason: 'missing Host header' };
  const m = /^(\[[^\]]+\]|[^:]+)(?::(\d{1,5}))?$/.exec(hostHeader);
  if (!m?.[1]) return { ok: false, reason: 'unparseable Host header' };
  const hostPort = m[2] === undefined ? 80 : Number(m[2]);
  if (hostPort !== port) return { ok: false, reason: 'Host port does not match listener' };
  const name = m[1].toLowerCase();
  if (name === 'localhost' || name === '127.0.0.1' || name === '[::1]') return OK;
  return { ok: false, reason: 'Host is not a loopback name' };
}

/**
 * A browser page must not drive the forwarder: an Origin, when present, must be a loopback
 * origin. `null` and anything unparseable are refused; a missing Origin (CLI agents) passes.
 */
export function checkOrigin(origin: string | undefined): Check {
  if (origin === undefined) return OK;
  let url: URL;
  try {
    url = new URL(origin);
  } catch {
    return { ok: false, reason: 'unparseable Origin' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return { ok: false, reason: 'Origin scheme is not http(s)' };
  if (!isLoopbackHostname(url.hostname)) return { ok: false, reason: 'Origin is not loopback' };
  return OK;
}
