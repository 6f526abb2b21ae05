import { createHash, createHmac } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';

/**
 * A SigV4 check as AWS does it, written from the specification (docs.aws.amazon.com,
 * "Create a signed AWS API request") and independent of the library the proxy signs with:
 * what the fake S3/STS of the tests accept. Returns undefined if the request is signed
 * with `secretAccessKey`, else why not.
 */
export interface SignedRequest {
  method: string;
  /** The raw request target, path and query as received. */
  url: string;
  headers: IncomingHttpHeaders;
  /** The whole body, when the payload hash is not in x-amz-content-sha256. */
  body?: Buffer;
}

const AUTH = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, ?SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})$/;

function rfc3986(s: string): string {
  return encodeURIComponent(s).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

function canonicalQuery(raw: string): string {
  return raw
    .split('&')
    .filter((p) => p !== '')
    .map((p) => {
      const eq = p.indexOf('=');
      const k = decodeURIComponent(eq === -1 ? p : p.slice(0, eq));
      const v = eq === -1 ? '' : decodeURIComponent(p.slice(eq + 1));
      return [rfc3986(k), rfc3986(v)] as const;
    })
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`)
    .join('&');
}

const sha256 = (data: string | Buffer): string => createHash('sha256').update(data).digest('hex');
const hmac = (key: Buffer | string, data: string): Buffer => createHmac('sha256', key).update(data).digest();

export interface Verified {
  accessKeyId: string;
  region: string;
  service: string;
  signedHeaders: string[];
}

export function verifySigV4(req: SignedRequest, accessKeyId: string, secretAccessKey: string): Verified | string {
  const auth = req.headers.authorization;
  const m = typeof auth === 'string' ? AUTH.exec(auth) : null;
  if (!m) return 'no SigV4 Authorization header';
  const [, keyId, day, region, service, signed, signature] = m as unknown as [string, string, string, string, string, string, string];
  if (keyId !== accessKeyId) return `signed with another access key id (${keyId})`;
  const amzDate = req.headers['x-amz-date'];
  if (typeof amzDate !== 'string' || !amzDate.startsWith(day)) return 'x-amz-date missing or not the credential\'s day';
  const q = req.url.indexOf('?');
  const path = q === -1 ? req.url : req.url.slice(0, q);
  const query = q === -1 ? '' : req.url.slice(q + 1);
  // S3 signs the path as sent; the other services sign it percent-encoded once more.
  const uri = service === 's3' ? path : path.split('/').map(rfc3986).join('/');
  const names = signed.split(';');
  if (!names.includes('host')) return 'host is not signed';
  for (const name of Object.keys(req.headers)) if (name.startsWith('x-amz-') && !names.includes(name)) return `${name} is sent but not signed`;
  const headerLines = names.map((n) => {
    const v = req.headers[n];
    if (v === undefined) return `${n}:`;
    return `${n}:${(Array.isArray(v) ? v.join(',') : v).trim().replace(/\s+/g, ' ')}`;
  });
  const declared = req.headers['x-amz-content-sha256'];
  const payload = typeof declared === 'string' ? declared : sha256(req.body ?? Buffer.alloc(0));
  if (typeof declared === 'string' && /^[0-9a-f]{64}$/.test(declared) && req.body !== undefined && sha256(req.body) !== declared) return 'x-amz-content-sha256 is not the body\'s hash';
  const canonical = [req.method, uri, canonicalQuery(query), ...headerLines, '', signed, payload].join('\n');
  const scope = `${day}/${region}/${service}/aws4_request`;
  const toSign = ['AWS4-HMAC-SHA256', amzDate, scope, sha256(canonical)].join('\n');
  const key = hmac(hmac(hmac(hmac(`AWS4${secretAccessKey}`, day), region), service), 'aws4_request');
  if (createHmac('sha256', key).update(toSign).digest('hex') !== signature) return 'signature does not match';
  return { accessKeyId: keyId, region, service, signedHeaders: names };
}

/** aws-chunked with unsigned chunks (and a trailer): the object's bytes. */
export function decodeAwsChunked(body: Buffer): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', at);
    if (eol === -1) throw new Error('aws-chunked: no chunk header');
    const size = parseInt(body.subarray(at, eol).toString('latin1').split(';')[0] as string, 16);
    at = eol + 2;
    if (size === 0) return Buffer.concat(parts);
    parts.push(body.subarray(at, at + size));
    at += size + 2;
  }
}
