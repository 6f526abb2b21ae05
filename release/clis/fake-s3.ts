import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { decodeAwsChunked, verifySigV4 } from '../../test/support/sigv4-verify.js';

/**
 * A fake S3 and STS for the CLI gate's AWS-signing cases (aws, s3cmd, rclone), as far as
 * those CLIs call them: it answers only requests signed (SigV4, checked by the tests' own
 * verifier, independent of the proxy's signer) with the real key for the host's own
 * region, as AWS does; anything else gets S3's 403. Buckets are path-style on
 * `s3.<region>.amazonaws.com` or virtual-hosted on `<bucket>.s3.<region>.amazonaws.com`.
 */
export interface FakeS3Options {
  accessKeyId: string;
  secretAccessKey: string;
  region: string;
  /** The bucket that exists (listed, written to). */
  bucket: string;
}

export interface FakeS3 {
  /** The real host names it answers under (the gate's certificate names and --resolve entries). */
  hosts: readonly string[];
  serve(req: IncomingMessage, body: Buffer, res: ServerResponse): void;
  /** What was uploaded, by `<bucket>/<key>`. */
  objects: Map<string, Buffer>;
}


const xmlEscape = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const md5 = (b: Buffer): string => createHash('md5').update(b).digest('hex');
const CREATED = '2025-01-01T00:00:00.000Z';
const S3_NS = 'http://s3.amazonaws.com/doc/2006-03-01/';

export function fakeS3(o: FakeS3Options): FakeS3 {
  const s3Host = `s3.${o.region}.amazonaws.com`;
  const stsHost = `sts.${o.region}.amazonaws.com`;
  const bucketHost = `${o.bucket}.${s3Host}`;
  const objects = new Map<string, Buffer>();

  const xml = (res: ServerResponse, status: number, text: string): void => {
    res.writeHead(status, { 'content-type': 'application/xml', 'content-length': Buffer.byteLength(text), 'x-amz-request-id': 'FAKE' });
    res.end(text);
  };
  const error = (res: ServerResponse, status: number, code: string, message: string): void =>
    xml(res, status, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>${code}</Code><Message>${xmlEscape(message)}</Message><RequestId>FAKE</RequestId></Error>`);

  function listObjects(res: ServerResponse, query: URLSearchParams): void {
    const prefix = query.get('prefix') ?? '';
    const keys = [...objects.keys()].filter((k) => k.startsWith(`${o.bucket}/`)).map((k) => k.slice(o.bucket.length + 1)).filter((k) => k.startsWith(prefix)).sort();
    const contents = keys
      .map((k) => {
        const data = objects.get(`${o.bucket}/${k}`) as Buffer;
        return `<Contents><Key>${xmlEscape(k)}</Key><LastModified>${CREATED}</LastModified><ETag>"${md5(data)}"</ETag><Size>${data.length}</Size><StorageClass>STANDARD</StorageClass></Contents>`;
      })
      .join('');
    const v2 = query.get('list-type') === '2' ? `<KeyCount>${keys.length}</KeyCount>` : '<Marker></Marker>';
    xml(res, 200, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="${S3_NS}"><Name>${o.bucket}</Name><Prefix>${xmlEscape(prefix)}</Prefix>${v2}<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>${contents}</ListBucketResult>`);
  }

  function serve(req: IncomingMessage, body: Buffer, res: ServerResponse): void {
    const host = (req.headers.host ?? '').replace(/:443$/, '');
    const method = req.method ?? '';
    const url = new URL(req.url ?? '/', 'https://fake.invalid');
    const v = verifySigV4({ method, url: req.url ?? '/', headers: req.headers, body }, o.accessKeyId, o.secretAccessKey);
    if (typeof v === 'string') return error(res, 403, 'SignatureDoesNotMatch', v);
    if (v.region !== o.region) return error(res, 400, 'AuthorizationHeaderMalformed', `the region '${v.region}' is wrong; expecting '${o.region}'`);

    if (host === stsHost) {
      if (method === 'POST' && new URLSearchParams(body.toString()).get('Action') === 'GetCallerIdentity') {
        return xml(res, 200, '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/real</Arn><UserId>AIDAREAL</UserId><Account>123456789012</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>x</RequestId></ResponseMetadata></GetCallerIdentityResponse>');
      }
      return error(res, 400, 'InvalidAction', 'not served by the fake');
    }
    // Path-style (`/bucket/key`) or virtual-hosted (`bucket.s3…` + `/key`).
    let bucket: string;
    let key: string;
    const path = decodeURIComponent(url.pathname);
    if (host === bucketHost) {
      bucket = o.bucket;
      key = path.slice(1);
    } else if (host === s3Host) {
      const slash = path.indexOf('/', 1);
      bucket = slash === -1 ? path.slice(1) : path.slice(1, slash);
      key = slash === -1 ? '' : path.slice(slash + 1);
    } else return error(res, 400, 'InvalidHost', `not a host of the fake: ${host}`);

    if (bucket === '') {
      if (method !== 'GET') return error(res, 405, 'MethodNotAllowed', 'on the service');
      return xml(res, 200, `<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="${S3_NS}"><Owner><ID>o</ID><DisplayName>real</DisplayName></Owner><Buckets><Bucket><Name>${o.bucket}</Name><CreationDate>${CREATED}</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>`);
    }
    if (bucket !== o.bucket) return error(res, 404, 'NoSuchBucket', bucket);
    if (key === '') {
      if (method === 'GET' && url.searchParams.has('location')) return xml(res, 200, `<?xml version="1.0" encoding="UTF-8"?><LocationConstraint xmlns="${S3_NS}">${o.region}</LocationConstraint>`);
      if (method === 'GET') return listObjects(res, url.searchParams);
      if (method === 'HEAD') {
        res.writeHead(200, { 'x-amz-bucket-region': o.region, 'content-length': 0 });
        return void res.end();
      }
      if (method === 'PUT') return error(res, 409, 'BucketAlreadyOwnedByYou', bucket);
      return error(res, 405, 'MethodNotAllowed', 'on the bucket');
    }
    const name = `${bucket}/${key}`;
    if (method === 'PUT') {
      const data = req.headers['content-encoding']?.includes('aws-chunked') ? decodeAwsChunked(body) : body;
      objects.set(name, data);
      res.writeHead(200, { etag: `"${md5(data)}"`, 'content-length': 0 });
      return void res.end();
    }
    const data = objects.get(name);
    if (data === undefined) {
      if (method === 'HEAD') {
        res.writeHead(404, { 'content-length': 0 });
        return void res.end();
      }
      return error(res, 404, 'NoSuchKey', key);
    }
    if (method === 'GET' || method === 'HEAD') {
      res.writeHead(200, { etag: `"${md5(data)}"`, 'content-length': data.length, 'content-type': 'application/octet-stream', 'last-modified': new Date(CREATED).toUTCString() });
      return void res.end(method === 'GET' ? data : undefined);
    }
    return error(res, 405, 'MethodNotAllowed', 'on the object');
  }

  return { hosts: [s3Host, bucketHost, stsHost], serve, objects };
}
