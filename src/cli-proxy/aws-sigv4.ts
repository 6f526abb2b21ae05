import { Hash } from '@smithy/hash-node';
import { SignatureV4 } from '@smithy/signature-v4';
import { z } from 'zod';
import { AppError } from '../errors.js';
import type { HeaderRecord } from '../http/headers.js';

/**
 * `inject.type: "aws-sigv4"` (SPEC §10): the CLI signs with the placeholder key; the proxy
 * drops that signature and signs again with the real key. Signing is @smithy/signature-v4,
 * the signer of the AWS SDK for JavaScript v3, with @smithy/hash-node (node's own crypto,
 * as that SDK uses on Node) rather than a pure-JS SHA-256: the same canonicalisation AWS
 * ships, and hashing a buffered body at native speed.
 */

/** The token file's JSON; one line of visible ASCII like every token file (token-file.ts). */
export const awsCredentialsSchema = z.strictObject({
  accessKeyId: z.string().regex(/^[A-Z0-9]{16,128}$/, 'not an access key id'),
  secretAccessKey: z.string().min(16).max(256),
  sessionToken: z.string().min(1).max(8192).optional(),
});
export type AwsCredentials = z.infer<typeof awsCredentialsSchema>;

/** The credentials in a token file's text, or undefined (the reason never names a value). */
export function parseAwsCredentials(token: string): AwsCredentials | undefined {
  let json: unknown;
  try {
    json = JSON.parse(token);
  } catch {
    return undefined;
  }
  const parsed = awsCredentialsSchema.safeParse(json);
  return parsed.success ? parsed.data : undefined;
}

/** What the CLI's own signature put on the request: never sent on. */
export const AWS_SIGNATURE_HEADERS: readonly string[] = ['authorization', 'x-amz-date', 'x-amz-security-token'];

/** A presigned URL's parameters: a request signed in its headers must not carry them too. */
const QUERY_SIGNATURE_PARAMS = new Set(['x-amz-algorithm', 'x-amz-credential', 'x-amz-date', 'x-amz-expires', 'x-amz-signedheaders', 'x-amz-signature', 'x-amz-security-token']);

/**
 * Payload hashes whose chunks carry signatures made with the CLI's (placeholder) key: the
 * proxy would have to re-sign every chunk, which it does not; refused, never sent on.
 */
const SIGNED_CHUNK_PAYLOADS = /^STREAMING-(AWS4-HMAC-SHA256|AWS4-ECDSA-P256-SHA256)-(PAYLOAD|EVENTS)/;

const UNSIGNED_HEADERS = new Set(['content-length']);

export interface AwsScope {
  region: string;
  service: string;
}

const REGION = /^[a-z]{2}(-[a-z]+)+-\d+$/;
/** Endpoint prefixes whose signing name differs (botocore's endpoints.json `credentialScope`). */
const SIGNING_NAMES: Readonly<Record<string, string>> = { email: 'ses', 'runtime.lex': 'lex', 'runtime.sagemaker': 'sagemaker', 'data.iot': 'iotdata' };
/** Services whose one endpoint signs for us-east-1 without naming a region. */
const GLOBAL_REGION = 'us-east-1';

/**
 * The signing region and service of an `*.amazonaws.com` host, as the SDKs' endpoint
 * rules name them: `s3`, `s3.<region>`, `s3-<region>`, `<bucket>.s3[.-]<region>`,
 * `s3.dualstack.<region>`, `<bucket>.s3-accesspoint`…, `sts`, `iam`,
 * `<service>[-fips].<region>`. Undefined for a host outside amazonaws.com or of no known form.
 */
export function awsScopeOfHost(host: string): AwsScope | undefined {
  const name = host.toLowerCase().replace(/:443$/, '').replace(/\.$/, '');
  const cn = name.endsWith('.amazonaws.com.cn');
  if (!cn && !name.endsWith('.amazonaws.com')) return undefined;
  const labels = name.slice(0, name.length - (cn ? '.amazonaws.com.cn' : '.amazonaws.com').length).split('.');
  if (labels.some((l) => l === '')) return undefined;
  // S3: the bucket (which may itself hold dots) comes before the s3 label; find that label from the right.
  for (let i = labels.length - 1; i >= 0; i -= 1) {
    const label = labels[i] as string;
    const dashRegion = /^s3-(.+)$/.exec(label)?.[1];
    if (label === 's3' || label === 's3-fips' || label === 's3-accesspoint' || label === 's3-control' || (dashRegion !== undefined && REGION.test(dashRegion))) {
      if (dashRegion !== undefined && REGION.test(dashRegion)) return { service: 's3', region: dashRegion };
      const region = labels.slice(i + 1).find((l) => REGION.test(l));
      return { service: 's3', region: region ?? GLOBAL_REGION };
    }
  }
  const last = labels[labels.length - 1] as string;
  if (REGION.test(last) && labels.length >= 2) {
    const prefix = labels.slice(0, -1).join('.').replace(/-fips$/, '');
    return { service: SIGNING_NAMES[prefix] ?? prefix, region: last };
  }
  if (labels.length === 1) return { service: SIGNING_NAMES[last] ?? last.replace(/-fips$/, ''), region: GLOBAL_REGION };
  return undefined;
}

/** The decoded query map the signer canonicalises, less a presigned URL's parameters; the URL keeps the same. */
function signableQuery(url: URL): Record<string, string | string[]> {
  const raw = url.search.startsWith('?') ? url.search.slice(1) : url.search;
  const kept: string[] = [];
  const query: Record<string, string | string[]> = {};
  for (const pair of raw.split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const key = decode(eq === -1 ? pair : pair.slice(0, eq));
    if (QUERY_SIGNATURE_PARAMS.has(key.toLowerCase())) continue;
    kept.push(pair);
    const value = eq === -1 ? '' : decode(pair.slice(eq + 1));
    const had = query[key];
    query[key] = had === undefined ? value : Array.isArray(had) ? [...had, value] : [had, value];
  }
  url.search = kept.length ? `?${kept.join('&')}` : '';
  return query;
}

function decode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    throw new AppError('aws_request_unsigned', 'The request\'s query is not valid percent-encoding; it cannot be signed.');
  }
}

/**
 * Signs the outgoing request in place (headers, and the URL less any presigned-URL
 * parameters). The CLI's `x-amz-content-sha256` (a hex hash, `UNSIGNED-PAYLOAD`,
 * `STREAMING-UNSIGNED-PAYLOAD-TRAILER`) is signed as the payload hash, so a streamed body
 * is never buffered; without it, `body` must be the whole body (or undefined for none).
 */
export async function signAws(credentials: AwsCredentials, method: string, url: URL, headers: HeaderRecord, body: Buffer | undefined, signingDate?: Date): Promise<void> {
  const scope = awsScopeOfHost(url.host);
  if (!scope) throw new AppError('aws_request_unsigned', 'The request\'s host is not an AWS endpoint this proxy can sign for.');
  const declared = headers['x-amz-content-sha256'];
  if (typeof declared === 'string' && SIGNED_CHUNK_PAYLOADS.test(declared)) {
    throw new AppError('aws_request_unsigned', `Chunk-signed uploads (${declared}) are not served: the chunks carry the placeholder key's signatures. Use UNSIGNED-PAYLOAD or a checksum trailer (the AWS CLI's default over https).`);
  }
  for (const name of AWS_SIGNATURE_HEADERS) delete headers[name];
  const flat: Record<string, string> = { host: url.host };
  for (const [k, v] of Object.entries(headers)) flat[k] = Array.isArray(v) ? v.join(',') : v;
  const signer = new SignatureV4({
    credentials: { accessKeyId: credentials.accessKeyId, secretAccessKey: credentials.secretAccessKey, ...(credentials.sessionToken !== undefined ? { sessionToken: credentials.sessionToken } : {}) },
    region: scope.region,
    service: scope.service,
    sha256: Hash.bind(null, 'sha256'),
    // S3 signs the path as sent; every other service signs it percent-encoded once more.
    uriEscapePath: scope.service !== 's3',
  });
  const signed = await signer.sign(
    { method, protocol: url.protocol, hostname: url.hostname, path: url.pathname, query: signableQuery(url), headers: flat, body },
    // Content-Length is not signed: the upstream client computes its own and leaves out a
    // `Content-Length: 0` on a GET (s3cmd sends one), and a signed header that does not
    // arrive fails the signature. AWS needs only host and the x-amz-* headers signed.
    { unsignableHeaders: UNSIGNED_HEADERS, ...(signingDate ? { signingDate } : {}) },
  );
  for (const [k, v] of Object.entries(signed.headers)) {
    if (k === 'host') continue;
    headers[k.toLowerCase()] = v;
  }
}
