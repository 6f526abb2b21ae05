import t from 'tap';
import { AWS_SIGNATURE_HEADERS, awsScopeOfHost, parseAwsCredentials, signAws } from '../../src/cli-proxy/aws-sigv4.js';
import { strippedHeaders } from '../../src/cli-proxy/inject.js';
import { parseCatalog } from '../../src/data/catalog.js';
import { AppError } from '../../src/errors.js';
import type { HeaderRecord } from '../../src/http/headers.js';
import { verifySigV4 } from '../support/sigv4-verify.js';

const REAL = { accessKeyId: 'AKIAREALKEYUNIT00001', secretAccessKey: 'real/Secret+Key-unit-0123456789abcdefABCDEF' };
const PLACEHOLDER_AUTH = 'AWS4-HMAC-SHA256 Credential=AKIAPLACEHOLDER00000/20250101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=' + '0'.repeat(64);

t.test('awsScopeOfHost: region and service of the *.amazonaws.com host forms', async (t) => {
  const cases: Array<[string, string, string] | [string, undefined]> = [
    ['s3.amazonaws.com', 's3', 'us-east-1'],
    ['s3.eu-west-1.amazonaws.com', 's3', 'eu-west-1'],
    ['s3-eu-west-1.amazonaws.com', 's3', 'eu-west-1'],
    ['my-bucket.s3.amazonaws.com', 's3', 'us-east-1'],
    ['my-bucket.s3.eu-west-1.amazonaws.com', 's3', 'eu-west-1'],
    ['my.dotted.bucket.s3.ap-southeast-2.amazonaws.com', 's3', 'ap-southeast-2'],
    ['my-bucket.s3-us-west-2.amazonaws.com', 's3', 'us-west-2'],
    ['s3.dualstack.us-east-2.amazonaws.com', 's3', 'us-east-2'],
    ['bucket.s3-fips.us-gov-west-1.amazonaws.com', 's3', 'us-gov-west-1'],
    ['ap-123456789012.s3-accesspoint.eu-central-1.amazonaws.com', 's3', 'eu-central-1'],
    ['sts.amazonaws.com', 'sts', 'us-east-1'],
    ['sts.eu-west-1.amazonaws.com', 'sts', 'eu-west-1'],
    ['iam.amazonaws.com', 'iam', 'us-east-1'],
    ['ec2.ap-northeast-1.amazonaws.com', 'ec2', 'ap-northeast-1'],
    ['dynamodb-fips.us-east-1.amazonaws.com', 'dynamodb', 'us-east-1'],
    ['email.eu-west-1.amazonaws.com', 'ses', 'eu-west-1'],
    ['runtime.sagemaker.us-east-1.amazonaws.com', 'sagemaker', 'us-east-1'],
    ['S3.EU-WEST-1.AMAZONAWS.COM', 's3', 'eu-west-1'],
    ['s3.cn-north-1.amazonaws.com.cn', 's3', 'cn-north-1'],
    ['amazonaws.com', undefined],
    ['evil.example', undefined],
    ['s3.amazonaws.com.evil.example', undefined],
    ['a..s3.amazonaws.com', undefined],
    ['foo.bar.amazonaws.com', undefined],
  ];
  for (const [host, service, region] of cases) {
    t.same(awsScopeOfHost(host), service === undefined ? undefined : { service, region }, host);
  }
});

t.test('parseAwsCredentials: the JSON of the token file, strictly', async (t) => {
  t.same(parseAwsCredentials(JSON.stringify(REAL)), REAL);
  t.same(parseAwsCredentials(JSON.stringify({ ...REAL, sessionToken: 'FwoGZXIvYXdzEXAMPLE' })), { ...REAL, sessionToken: 'FwoGZXIvYXdzEXAMPLE' });
  t.equal(parseAwsCredentials('AKIAREALKEYUNIT00001'), undefined, 'not JSON');
  t.equal(parseAwsCredentials(JSON.stringify({ accessKeyId: REAL.accessKeyId })), undefined, 'no secret');
  t.equal(parseAwsCredentials(JSON.stringify({ ...REAL, extra: 1 })), undefined, 'an unknown field');
});

t.test('strippedHeaders for aws-sigv4 drops the CLI\'s signature headers', async (t) => {
  const names = strippedHeaders({ type: 'aws-sigv4' });
  for (const n of AWS_SIGNATURE_HEADERS) t.ok(names.has(n), n);
  t.notOk(names.has('x-amz-content-sha256'), 'the payload hash the CLI chose is kept');
});

async function signed(method: string, target: string, headers: HeaderRecord, body?: Buffer, creds: typeof REAL & { sessionToken?: string } = REAL): Promise<{ url: URL; headers: HeaderRecord }> {
  const url = new URL(target);
  await signAws(creds, method, url, headers, body);
  return { url, headers };
}

function check(url: URL, method: string, headers: HeaderRecord, body?: Buffer, secret = REAL.secretAccessKey): ReturnType<typeof verifySigV4> {
  return verifySigV4({ method, url: `${url.pathname}${url.search}`, headers: { ...headers, host: url.host }, ...(body ? { body } : {}) }, REAL.accessKeyId, secret);
}

t.test('S3 GET with the CLI\'s UNSIGNED-PAYLOAD: re-signed with the real key, the query kept byte for byte', async (t) => {
  const { url, headers } = await signed('GET', 'https://my-bucket.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=a%20b%2Fc&delimiter=%2F', {
    authorization: PLACEHOLDER_AUTH,
    'x-amz-date': '20250101T000000Z',
    'x-amz-content-sha256': 'UNSIGNED-PAYLOAD',
    'user-agent': 'aws-cli/2.9.19',
  });
  t.equal(url.search, '?list-type=2&prefix=a%20b%2Fc&delimiter=%2F');
  const v = check(url, 'GET', headers);
  t.match(v, { region: 'eu-west-1', service: 's3' }, `verifies with the real secret (${typeof v === 'string' ? v : 'ok'})`);
  t.not(headers.authorization, PLACEHOLDER_AUTH);
  t.equal(headers['x-amz-content-sha256'], 'UNSIGNED-PAYLOAD');
  t.type(check(url, 'GET', headers, undefined, 'placeholder-secret-0000000000'), 'string', 'and not with another secret');
  t.type(check(url, 'GET', { ...headers, 'x-amz-content-sha256': 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' }), 'string', 'the payload hash is signed');
});

t.test('a GET with Content-Length: 0 (s3cmd): verifies as sent upstream, where a bodiless GET carries no Content-Length', async (t) => {
  const { url, headers } = await signed('GET', 'https://s3.eu-north-1.amazonaws.com/', {
    authorization: PLACEHOLDER_AUTH,
    'x-amz-date': '20250101T000000Z',
    'x-amz-content-sha256': 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    'content-length': '0',
  });
  const { 'content-length': _dropped, ...onTheWire } = headers;
  const v = check(url, 'GET', onTheWire);
  t.match(v, { region: 'eu-north-1', service: 's3' }, `verifies without it (${typeof v === 'string' ? v : 'ok'})`);
  t.match(check(url, 'GET', headers), { service: 's3' }, 'and with it');
});

t.test('S3 PUT with an aws-chunked unsigned-trailer body: the CLI\'s hash and encoding headers are signed, nothing buffered', async (t) => {
  const { url, headers } = await signed('PUT', 'https://bucket.s3.eu-west-1.amazonaws.com/dir/a%20file.txt', {
    'x-amz-content-sha256': 'STREAMING-UNSIGNED-PAYLOAD-TRAILER',
    'content-encoding': 'aws-chunked',
    'x-amz-decoded-content-length': '5',
    'x-amz-trailer': 'x-amz-checksum-crc32',
    'transfer-encoding': 'chunked',
  });
  const v = check(url, 'PUT', headers);
  t.match(v, { service: 's3' }, `verifies (${typeof v === 'string' ? v : 'ok'})`);
  if (typeof v !== 'string') for (const h of ['x-amz-decoded-content-length', 'x-amz-trailer', 'content-encoding']) t.ok(v.signedHeaders.includes(h), `${h} signed`);
});

t.test('a non-S3 service: the body hashed, the path encoded once more, the session token sent', async (t) => {
  const body = Buffer.from('Action=GetCallerIdentity&Version=2011-06-15');
  const { url, headers } = await signed(
    'POST',
    'https://sts.eu-west-1.amazonaws.com/a%20b',
    { 'content-type': 'application/x-www-form-urlencoded; charset=utf-8', 'content-length': String(body.length), 'x-amz-security-token': 'placeholder-session' },
    body,
    { ...REAL, sessionToken: 'real-session-token-XYZ' },
  );
  t.equal(headers['x-amz-security-token'], 'real-session-token-XYZ', 'the real session token replaces the CLI\'s');
  const v = check(url, 'POST', headers, body);
  t.match(v, { service: 'sts', region: 'eu-west-1' }, `verifies (${typeof v === 'string' ? v : 'ok'})`);
  t.type(check(url, 'POST', headers, Buffer.from('Action=DeleteUser')), 'string', 'another body does not verify');
});

t.test('a presigned URL\'s query parameters are dropped: the request is signed in its headers only', async (t) => {
  const { url, headers } = await signed('GET', 'https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAPLACEHOLDER00000%2F20250101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=00&versionId=3', {
    'x-amz-content-sha256': 'UNSIGNED-PAYLOAD',
  });
  t.equal(url.search, '?versionId=3');
  t.match(check(url, 'GET', headers), { service: 's3' });
});

t.test('refused, nothing signed: chunk-signed uploads, a host of no AWS form, a broken query', async (t) => {
  for (const payload of ['STREAMING-AWS4-HMAC-SHA256-PAYLOAD', 'STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER', 'STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD']) {
    const headers: HeaderRecord = { 'x-amz-content-sha256': payload };
    await t.rejects(signAws(REAL, 'PUT', new URL('https://b.s3.amazonaws.com/k'), headers, undefined), { code: 'aws_request_unsigned' }, payload);
    t.equal(headers.authorization, undefined, `${payload}: no signature`);
  }
  await t.rejects(signAws(REAL, 'GET', new URL('https://api.github.com/user'), {}, undefined), AppError);
  await t.rejects(signAws(REAL, 'GET', new URL('https://s3.amazonaws.com/?a=%zz'), { 'x-amz-content-sha256': 'UNSIGNED-PAYLOAD' }, undefined), { code: 'aws_request_unsigned' });
});

t.test('the catalog takes inject {"type": "aws-sigv4"} and nothing more in it', async (t) => {
  const provider = (inject: unknown): string =>
    JSON.stringify({ aws: { mode: 'tls', hosts: ['sts.amazonaws.com', '*.s3.eu-west-1.amazonaws.com'], tokenFile: '/var/lib/x/aws.token', inject, commands: [{ name: 'aws', env: { AWS_ACCESS_KEY_ID: '{placeholder}' } }] } });
  t.ok(parseCatalog(provider({ type: 'aws-sigv4' })).ok, 'accepted');
  t.notOk(parseCatalog(provider({ type: 'aws-sigv4', region: 'us-east-1' })).ok, 'an extra field is refused');
});
