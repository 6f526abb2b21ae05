/**
 * `inject.type: "aws-sigv4"` (SPEC §10, issue 20): the real AWS CLI (Debian's awscli), run as
 * the agent UID through its TLS-mode shim with a placeholder key, reaches a fake S3 and STS
 * under their real host names that accept only requests signed with the real key, checked
 * by a SigV4 verifier of the test's own (test/support/sigv4-verify.ts).
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { ensureAgentUser, runAsAgent, snapshotProcsOf, type AgentRunResult, type ProcSnapshot } from '../test/support/agent-user.js';
import { knownSecrets, leakedSecrets, startCli, writeToken } from '../test/support/cli-proc.js';
import { startProxy } from '../test/support/proxy-rig.js';
import { decodeAwsChunked, verifySigV4 } from '../test/support/sigv4-verify.js';
import { issueServerCert, makeTestCa, tlsLabDirs } from '../test/support/test-ca.js';
import { whenRootWithTools } from '../test/tools/prerequisite.js';

const REAL = { accessKeyId: 'AKIAREALCONTRACT0001', secretAccessKey: `RealSecret/${process.pid}+contract0aws0test0key00` };
const PLACEHOLDER = 'AKIAPLACEHOLDER00000';
const REGION = 'eu-west-1';
const BUCKET = 'ac-test-bucket';
const S3_HOST = `s3.${REGION}.amazonaws.com`;
const BUCKET_HOST = `${BUCKET}.s3.${REGION}.amazonaws.com`;
const STS_HOST = `sts.${REGION}.amazonaws.com`;
const HOSTS = [S3_HOST, BUCKET_HOST, STS_HOST];
/** Debian's package, not a copy in root's home the agent UID cannot reach. */
const AWS = '/usr/bin/aws';
/** A stop for a hung CLI, not a timing check: Python's start alone takes seconds on a busy machine. */
const AWS_TIMEOUT_MS = 120_000;

const missing = ['openssl'].filter((tool) => spawnSync(tool, ['version']).error !== undefined);
if (spawnSync(AWS, ['--version']).error !== undefined) missing.push('aws');
await whenRootWithTools(t, missing, 'awscli, openssl', main);

interface Seen {
  method: string;
  host: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
  verdict: string;
  snapshot: ProcSnapshot[];
}

/** One https server for every host, its certificate from the test's own CA; S3 and STS as far as the CLI calls them. */
async function fakeAws(dir: string, agentUid: number): Promise<{ server: Server; port: number; seen: Seen[]; objects: Map<string, Buffer> }> {
  const tls = issueServerCert(dir, 'aws', HOSTS);
  const seen: Seen[] = [];
  const objects = new Map<string, Buffer>();
  const server = createServer(tls);
  server.on('request', (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const host = (req.headers.host ?? '').replace(/:443$/, '');
      const method = req.method ?? '';
      const url = req.url ?? '';
      const v = verifySigV4({ method, url, headers: req.headers, body }, REAL.accessKeyId, REAL.secretAccessKey);
      seen.push({ method, host, url, headers: req.headers, body, verdict: typeof v === 'string' ? v : 'ok', snapshot: snapshotProcsOf(agentUid) });
      const xml = (status: number, text: string): void => {
        res.writeHead(status, { 'content-type': 'text/xml', 'content-length': Buffer.byteLength(text), 'x-amz-request-id': 'FAKE' });
        res.end(text);
      };
      if (typeof v === 'string') {
        xml(403, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SignatureDoesNotMatch</Code><Message>${v}</Message></Error>`);
        return;
      }
      if (host === STS_HOST && method === 'POST') {
        xml(200, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/real</Arn><UserId>AIDAREAL</UserId><Account>123456789012</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>x</RequestId></ResponseMetadata></GetCallerIdentityResponse>`);
        return;
      }
      if (host === S3_HOST && method === 'GET' && url.split('?')[0] === '/') {
        xml(200, `<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Owner><ID>o</ID></Owner><Buckets><Bucket><Name>${BUCKET}</Name><CreationDate>2025-01-01T00:00:00.000Z</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>`);
        return;
      }
      if (host === BUCKET_HOST && method === 'PUT') {
        const data = req.headers['content-encoding']?.includes('aws-chunked') ? decodeAwsChunked(body) : body;
        objects.set(decodeURIComponent(url.split('?')[0] as string), data);
        res.writeHead(200, { etag: '"fake"', 'content-length': 0 });
        res.end();
        return;
      }
      xml(404, '<Error><Code>NoSuchKey</Code></Error>');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  return { server, port: (server.address() as AddressInfo).port, seen, objects };
}

async function main(): Promise<void> {
  const agent = ensureAgentUser();
  const { base, state, pki, shimDir, bundle } = tlsLabDirs(t, 'ac-cli-aws-');
  const agentUsers = join(base, 'agent-users');
  writeFileSync(agentUsers, `${agent.name}\n`, { mode: 0o644 });
  const work = join(base, 'work');
  mkdirSync(work, { mode: 0o777 });
  chmodSync(work, 0o777);

  makeTestCa(pki, 'fake AWS test CA');
  const testCa = join(base, 'test-ca.pem');
  copyFileSync(join(pki, 'ca.pem'), testCa);
  chmodSync(testCa, 0o644);
  const aws = await fakeAws(pki, agent.uid);

  const tokenFile = join(state, 'cli-proxy', 'aws.token');
  writeToken(tokenFile, JSON.stringify(REAL));
  knownSecrets.add(REAL.secretAccessKey);
  const catalog = {
    aws: {
      mode: 'tls',
      hosts: [S3_HOST, `*.s3.${REGION}.amazonaws.com`, STS_HOST],
      tokenFile,
      inject: { type: 'aws-sigv4' },
      placeholder: PLACEHOLDER,
      commands: [{ name: 'aws', env: { AWS_ACCESS_KEY_ID: '{placeholder}', AWS_SECRET_ACCESS_KEY: '{placeholder}' } }],
    },
  };
  const proxy = await startProxy(t, 'cli-proxy', {
    stateDir: state,
    config: catalog,
    args: ['--agent-users-file', agentUsers, '--ca-bundle', bundle, ...HOSTS.flatMap((h) => ['--resolve', `${h}:443:127.0.0.1:${aws.port}`]), '--upstream-ca', testCa],
  });
  await proxy.waitForLog((l) => l.msg === 'catalog loaded' && l.providers === 1);
  const install = startCli(['shims', 'install', '--dir', shimDir, '--proxy-url', proxy.base, '--state-dir', state, '--ca-bundle', bundle]);
  const code = (await install.exited).code;
  if (code !== 0) throw new Error(`shims install exited ${code}: ${install.lines.join('\n')}`);

  const env = { PATH: [shimDir, '/usr/bin', '/bin'].join(':'), HOME: work, LANG: 'C.UTF-8', AWS_DEFAULT_REGION: REGION, AWS_EC2_METADATA_DISABLED: 'true', AWS_PAGER: '' };
  const leaksIn = (r: AgentRunResult): string[] => leakedSecrets(`${r.stdout}\n${r.stderr}`);
  const procsOf = (s: Seen | undefined): string => (s?.snapshot ?? []).map((p) => `${p.cmdline}\n${p.environ}`).join('\n');

  t.test('aws s3 ls: ListBuckets reaches the fake S3 signed with the real key', async (t) => {
    const before = aws.seen.length;
    const r = await runAsAgent(agent, 'aws s3 ls', { env, timeoutMs: AWS_TIMEOUT_MS });
    t.equal(r.code, 0, `aws exit 0 (${r.stderr.trim()})`);
    t.match(r.stdout, BUCKET, 'the bucket listed');
    const calls = aws.seen.slice(before);
    t.ok(calls.length > 0, 'the fake S3 was called');
    for (const c of calls) {
      t.equal(c.verdict, 'ok', `${c.method} ${c.host}${c.url}: SigV4 with the real key`);
      t.match(c.headers.authorization, `Credential=${REAL.accessKeyId}/`, 'the real access key id');
    }
    const procs = procsOf(calls[0]);
    t.match(procs, `AWS_ACCESS_KEY_ID=${PLACEHOLDER}`, 'the CLI ran with the placeholder key');
    t.same(leakedSecrets(procs), [], 'no agent-UID process held the real key in argv or env');
    t.same(leaksIn(r), [], 'nor printed it');
  });

  t.test('aws s3 cp uploads: the body arrives whole, signed with the real key', async (t) => {
    // Over the proxy's replay limit (64 KiB): streamed through, never buffered.
    const file = join(work, 'upload.txt');
    const content = `hello from the agent ${process.pid}\n`.repeat(8000);
    writeFileSync(file, content, { mode: 0o644 });
    const before = aws.seen.length;
    const r = await runAsAgent(agent, 'aws s3 cp "$1" "s3://$2/dir/up load.txt"', { env, args: [file, BUCKET], timeoutMs: AWS_TIMEOUT_MS });
    t.equal(r.code, 0, `aws exit 0 (${r.stderr.trim()})`);
    const calls = aws.seen.slice(before);
    const put = calls.find((c) => c.method === 'PUT');
    if (!put) t.comment(proxy.lines.slice(-5).join('\n'));
    t.ok(put, 'a PUT reached the fake S3');
    t.equal(put?.verdict, 'ok', `signed with the real key (payload ${String(put?.headers['x-amz-content-sha256'])}, ${String(put?.headers['content-encoding'])})`);
    t.equal(aws.objects.get('/dir/up load.txt')?.toString(), content, 'the object\'s bytes arrived unchanged');
    t.same(leaksIn(r), []);
  });

  t.test('aws sts get-caller-identity: a form-encoded POST to another service, its body hashed', async (t) => {
    const before = aws.seen.length;
    const r = await runAsAgent(agent, 'aws sts get-caller-identity --output json', { env, timeoutMs: AWS_TIMEOUT_MS });
    t.equal(r.code, 0, `aws exit 0 (${r.stderr.trim()})`);
    t.match(JSON.parse(r.stdout), { Account: '123456789012' });
    const call = aws.seen[before];
    t.equal(call?.verdict, 'ok', 'signed for sts with the real key');
    t.match(call?.headers.authorization, `/${REGION}/sts/aws4_request`);
    t.same(leaksIn(r), []);
  });

  t.test('with the real key gone from the token file, nothing reaches AWS with a usable signature', async (t) => {
    writeToken(tokenFile, JSON.stringify({ ...REAL, secretAccessKey: 'WrongSecretWrongSecret00' }));
    t.teardown(() => writeToken(tokenFile, JSON.stringify(REAL)));
    const r = await runAsAgent(agent, 'aws s3 ls', { env: { ...env, AWS_MAX_ATTEMPTS: '1' }, timeoutMs: AWS_TIMEOUT_MS });
    t.not(r.code, 0, 'the CLI fails');
    t.match(r.stderr, /SignatureDoesNotMatch/, 'the fake S3 refused the signature');
  });

  t.test('no secret in any line the proxy printed, nor in the shims', async (t) => {
    t.same(leakedSecrets(proxy.lines.join('\n')), []);
    for (const name of readdirSync(shimDir)) t.same(leakedSecrets(readFileSync(join(shimDir, name), 'utf8')), [], `${name} holds no secret`);
  });
}
