/**
 * TLS mode's upstream dispatcher (SPEC §10): the trust list is parsed once into a context
 * every connection shares (bench --tls: ~30 ms CPU per new connection otherwise), and
 * with it the certificate and its name are still checked — against that list only — also
 * where `--resolve` sends the connection to another address.
 */
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { createTlsUpstreamAgent, parseResolve } from '../../src/cli-proxy/tls-upstream.js';
import { defaultUpstreamOptions } from '../../src/http/upstream-agent.js';
import { issueServerCert, makeTestCa } from '../support/test-ca.js';
import type { TapTest } from '../support/tap.js';
import { tempDir } from '../support/temp-dir.js';

const HOST = 'api.example.test';

async function serve(t: TapTest, tls: { key: Buffer; cert: Buffer }): Promise<number> {
  const server: Server = createServer(tls, (_req, res) => res.end('ok'));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  return (server.address() as AddressInfo).port;
}

t.test('trusted by the list, for the catalog host: answered; another CA, or another name: refused', async (t) => {
  const a = tempDir('ac-tls-up-a-', t);
  const b = tempDir('ac-tls-up-b-', t);
  makeTestCa(a, 'upstream test CA A');
  makeTestCa(b, 'upstream test CA B');
  const good = await serve(t, issueServerCert(a, 'good', [HOST]));
  const wrongName = await serve(t, issueServerCert(a, 'other', ['other.example.test']));
  const caA = readFileSync(join(a, 'ca.pem'), 'utf8');
  const caB = readFileSync(join(b, 'ca.pem'), 'utf8');
  const call = async (ca: string, port: number): Promise<string> => {
    const agent = createTlsUpstreamAgent(defaultUpstreamOptions, ca, parseResolve([`${HOST}:443:127.0.0.1:${port}`]));
    try {
      const res = await agent.request({ origin: `https://${HOST}`, path: '/', method: 'GET' });
      return await res.body.text();
    } catch (err) {
      return `refused: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`;
    } finally {
      await agent.close();
    }
  };
  t.equal(await call(caA, good), 'ok', 'its CA in the list: answered');
  t.match(await call(caB, good), /^refused: (UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT_LOCALLY|SELF_SIGNED_CERT_IN_CHAIN)/, 'a list without its CA: refused');
  t.match(await call(`${caB}\n${caA}`, good), 'ok', 'a list of several: any of them');
  t.match(await call(caA, wrongName), /^refused: ERR_TLS_CERT_ALTNAME_INVALID/, 'a certificate for another name: refused');
});
