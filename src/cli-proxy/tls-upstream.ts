import { isIP } from 'node:net';
import { Agent, buildConnector } from 'undici';
import { ConfigError } from '../errors.js';
import type { UpstreamOptions } from '../http/upstream-agent.js';

/**
 * TLS mode's upstream side (SPEC §10): calls go to the catalog host the CLI asked for,
 * verified against the system's CAs, not Node's bundled list. Two test aids, off by
 * default: `--resolve HOST:PORT:ADDR` (curl's syntax; ADDR may carry its own port,
 * `127.0.0.1:8443` or `[::1]:8443`, so a fake SaaS needs no privileged port) and
 * `--upstream-ca FILE` (a CA the fake's certificate chains to). While either is given,
 * base-url providers' https upstreams use this dispatcher too (cli-proxy-service.ts).
 */

export interface Destination {
  address: string;
  port: number;
}

/** `host:port` (lower case) → where connections for it really go. */
export type ResolveMap = ReadonlyMap<string, Destination>;

export function resolveKey(host: string, port: number): string {
  return `${host.toLowerCase().replace(/\.$/, '')}:${port}`;
}

/** Parses the repeated `--resolve` values. */
export function parseResolve(values: readonly string[]): Map<string, Destination> {
  const map = new Map<string, Destination>();
  for (const value of values) {
    const m = /^([A-Za-z0-9.-]+):(\d{1,5}):(\[[0-9A-Fa-f:.]+\]|[0-9.]+)(?::(\d{1,5}))?$/.exec(value);
    const address = m?.[3]?.replace(/^\[|\]$/g, '');
    if (!m?.[1] || !m[2] || address === undefined || isIP(address) === 0) {
      throw new ConfigError(`--resolve must be HOST:PORT:ADDR (ADDR an IP address, optionally :PORT), got "${value}"`);
    }
    const port = Number(m[2]);
    const to = m[4] === undefined ? port : Number(m[4]);
    if (port < 1 || port > 65535 || to < 1 || to > 65535) throw new ConfigError(`--resolve port out of range in "${value}"`);
    map.set(resolveKey(m[1], port), { address, port: to });
  }
  return map;
}

/**
 * The dispatcher for intercepted requests: `ca` is the whole trust list (system + test
 * CAs); certificate and name checks stay on (the name checked is the catalog host's,
 * also where `--resolve` sends the connection elsewhere).
 */
export function createTlsUpstreamAgent(options: UpstreamOptions, ca: string, resolve: ResolveMap): Agent {
  const connector = buildConnector({ timeout: options.connectTimeoutMs, ca });
  return new Agent({
    headersTimeout: options.headersTimeoutMs,
    bodyTimeout: 0,
    keepAliveTimeout: 4_000,
    pipelining: 1,
    connect: (opts, callback) => {
      const port = Number(opts.port || 443);
      const to = resolve.get(resolveKey(opts.hostname, port));
      if (!to) {
        connector(opts, callback);
        return;
      }
      connector({ ...opts, hostname: to.address, port: String(to.port), servername: opts.hostname }, callback);
    },
  });
}
