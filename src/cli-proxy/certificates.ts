import { createHash, createPublicKey, KeyObject, randomBytes, webcrypto } from 'node:crypto';
import * as asn1js from 'asn1js';
import * as pkijs from 'pkijs';

/**
 * X.509 for TLS mode (SPEC §10) through pkijs, over Node's own WebCrypto: ECDSA P-256
 * keys (fast to make and to sign with) and SHA-256 signatures. Only the fields the
 * strictest common verifiers ask for: OpenSSL 3's X509_STRICT (Python 3.13's default,
 * so the AWS CLI) wants key usage on the CA, a subject key id on it and an authority
 * key id on the leaf; Go (gh) reads names from the SAN only. Why pkijs:
 * docs/design/tls-mode.md.
 */

const engine = new pkijs.CryptoEngine({ name: 'node', crypto: webcrypto as unknown as ConstructorParameters<typeof pkijs.CryptoEngine>[0]['crypto'] });
const EC_KEY: webcrypto.EcKeyGenParams = { name: 'ECDSA', namedCurve: 'P-256' };
const OID = {
  commonName: '2.5.4.3',
  basicConstraints: '2.5.29.19',
  keyUsage: '2.5.29.15',
  extKeyUsage: '2.5.29.37',
  subjectAltName: '2.5.29.17',
  subjectKeyId: '2.5.29.14',
  authorityKeyId: '2.5.29.35',
  serverAuth: '1.3.6.1.5.5.7.3.1',
} as const;
/** KeyUsage bits, first byte, as RFC 5280 §4.2.1.3 numbers them from the high bit. */
const DIGITAL_SIGNATURE = 0x80;
const KEY_CERT_SIGN = 0x04;
const CRL_SIGN = 0x02;

export interface IssuedCertificate {
  /** PEM, one certificate. */
  cert: string;
  /** PEM, PKCS#8. */
  key: string;
  notAfter: Date;
}

/** A CA ready to sign: its certificate as PEM and the parts of it a leaf repeats. */
export interface LoadedCa {
  cert: string;
  notAfter: Date;
  signing: webcrypto.CryptoKey;
  spki: pkijs.PublicKeyInfo;
  subject: pkijs.RelativeDistinguishedNames;
}

function pem(label: string, der: ArrayBuffer | Buffer): string {
  const b64 = Buffer.from(der as ArrayBuffer).toString('base64').replace(/.{64}/g, '$&\n').replace(/\n$/, '');
  return `-----BEGIN ${label}-----\n${b64}\n-----END ${label}-----\n`;
}

function derOf(text: string, label: string): Buffer {
  const m = new RegExp(`-----BEGIN ${label}-----([^-]+)-----END ${label}-----`).exec(text);
  if (!m?.[1]) throw new Error(`no ${label} in PEM`);
  return Buffer.from(m[1].replace(/\s+/g, ''), 'base64');
}

function name(commonName: string): pkijs.RelativeDistinguishedNames {
  return new pkijs.RelativeDistinguishedNames({
    typesAndValues: [
      new pkijs.AttributeTypeAndValue({ type: OID.commonName, value: new asn1js.Utf8String({ value: commonName }) }),
    ],
  });
}

function extension(extnID: string, critical: boolean, value: { toSchema(): asn1js.BaseBlock } | asn1js.BaseBlock): pkijs.Extension {
  const schema = value instanceof asn1js.BaseBlock ? value : value.toSchema();
  return new pkijs.Extension({ extnID, critical, extnValue: schema.toBER(false) });
}

function keyUsage(bits: number): asn1js.BitString {
  // One byte; the trailing unused bits are declared so DER stays minimal.
  let unused = 0;
  while (unused < 7 && (bits & (1 << unused)) === 0) unused++;
  return new asn1js.BitString({ valueHex: new Uint8Array([bits]).buffer, unusedBits: unused });
}

/** RFC 5280 §4.2.1.2 method (1): SHA-1 of the subjectPublicKey bits. */
function keyId(spki: pkijs.PublicKeyInfo): ArrayBuffer {
  const bits = Buffer.from(spki.subjectPublicKey.valueBlock.valueHexView);
  const digest = createHash('sha1').update(bits).digest();
  return digest.buffer.slice(digest.byteOffset, digest.byteOffset + digest.length);
}

/**
 * A positive 126-bit random serial. DER wants an INTEGER's shortest form: the high bit clear
 * (no sign byte) and the first byte never 0 (else a leading zero before a byte < 0x80 is
 * "illegal padding", which OpenSSL refuses: one leaf in 256 before this was fixed).
 */
export function serial(): asn1js.Integer {
  const bytes = randomBytes(16);
  bytes[0] = ((bytes[0] as number) & 0x3f) | 0x40;
  return new asn1js.Integer({ valueHex: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + 16) });
}

async function keyPair(): Promise<webcrypto.CryptoKeyPair> {
  return (await webcrypto.subtle.generateKey(EC_KEY, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
}

async function build(opts: {
  subject: string;
  issuer: pkijs.RelativeDistinguishedNames;
  publicKey: webcrypto.CryptoKey;
  signingKey: webcrypto.CryptoKey;
  notBefore: Date;
  notAfter: Date;
  extensions: (spki: pkijs.PublicKeyInfo) => pkijs.Extension[];
}): Promise<string> {
  const cert = new pkijs.Certificate();
  cert.version = 2;
  cert.serialNumber = serial();
  cert.issuer = opts.issuer;
  cert.subject = name(opts.subject);
  cert.notBefore.value = opts.notBefore;
  cert.notAfter.value = opts.notAfter;
  await cert.subjectPublicKeyInfo.importKey(opts.publicKey, engine);
  cert.extensions = opts.extensions(cert.subjectPublicKeyInfo);
  await cert.sign(opts.signingKey, 'SHA-256', engine);
  return pem('CERTIFICATE', cert.toSchema(true).toBER(false));
}

async function exportKey(key: webcrypto.CryptoKey): Promise<string> {
  return pem('PRIVATE KEY', await webcrypto.subtle.exportKey('pkcs8', key));
}

/** A new self-signed CA that may sign end-entity certificates only (path length 0). */
export async function createCa(commonName: string, validDays: number, now = new Date()): Promise<IssuedCertificate> {
  const keys = await keyPair();
  const notAfter = new Date(now.getTime() + validDays * 86_400_000);
  const cert = await build({
    subject: commonName,
    issuer: name(commonName),
    publicKey: keys.publicKey,
    signingKey: keys.privateKey,
    // An hour back: a client whose clock is a little behind still accepts it.
    notBefore: new Date(now.getTime() - 3_600_000),
    notAfter,
    extensions: (spki) => [
      extension(OID.basicConstraints, true, new pkijs.BasicConstraints({ cA: true, pathLenConstraint: 0 })),
      extension(OID.keyUsage, true, keyUsage(KEY_CERT_SIGN | CRL_SIGN)),
      extension(OID.subjectKeyId, false, new asn1js.OctetString({ valueHex: keyId(spki) })),
    ],
  });
  return { cert, key: await exportKey(keys.privateKey), notAfter };
}

/**
 * Loads a CA's PEM certificate and PKCS#8 key for signing (both may come from one text);
 * throws if they do not belong together.
 */
export async function loadCa(certPem: string, keyPem: string): Promise<LoadedCa> {
  const parsed = pkijs.Certificate.fromBER(derOf(certPem, 'CERTIFICATE'));
  const signing = await webcrypto.subtle.importKey('pkcs8', derOf(keyPem, 'PRIVATE KEY'), EC_KEY, false, ['sign']);
  const publicDer = createPublicKey(KeyObject.from(signing)).export({ type: 'spki', format: 'der' });
  if (!Buffer.from(parsed.subjectPublicKeyInfo.toSchema().toBER(false)).equals(publicDer)) throw new Error('the CA key does not match its certificate');
  // The certificate alone, re-encoded: `certPem` may be the CA file that holds the key too.
  return { cert: pem('CERTIFICATE', derOf(certPem, 'CERTIFICATE')), notAfter: parsed.notAfter.value, signing, spki: parsed.subjectPublicKeyInfo, subject: parsed.subject };
}

/**
 * A server certificate for exactly `host` (one DNS name in the SAN, no wildcard: a leaf
 * answers for the name the CLI asked for, nothing wider), valid `validMs` from now.
 */
export async function issueLeaf(ca: LoadedCa, host: string, validMs: number, now = new Date()): Promise<IssuedCertificate> {
  const keys = await keyPair();
  const notAfter = new Date(Math.min(now.getTime() + validMs, ca.notAfter.getTime()));
  const cert = await build({
    subject: host,
    issuer: ca.subject,
    publicKey: keys.publicKey,
    signingKey: ca.signing,
    notBefore: new Date(now.getTime() - 3_600_000),
    notAfter,
    extensions: () => [
      extension(OID.basicConstraints, true, new pkijs.BasicConstraints({ cA: false })),
      extension(OID.keyUsage, true, keyUsage(DIGITAL_SIGNATURE)),
      extension(OID.extKeyUsage, false, new pkijs.ExtKeyUsage({ keyPurposes: [OID.serverAuth] })),
      extension(OID.subjectAltName, false, new pkijs.GeneralNames({ names: [new pkijs.GeneralName({ type: 2, value: host })] })),
      extension(OID.authorityKeyId, false, new pkijs.AuthorityKeyIdentifier({ keyIdentifier: new asn1js.OctetString({ valueHex: keyId(ca.spki) }) })),
    ],
  });
  return { cert, key: await exportKey(keys.privateKey), notAfter };
}
