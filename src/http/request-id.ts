import { randomFillSync } from 'node:crypto';

/** Ids per refill of the pool: one getrandom(2) for 128 requests, as Node's own randomUUID does. */
const POOL_IDS = 128;
const pool = Buffer.alloc(16 * POOL_IDS);
let nextId = POOL_IDS;
const text = Buffer.alloc(36);
const HEX = Buffer.from('0123456789abcdef', 'latin1');

/**
 * A random (version 4, RFC 9562) UUID, lower-case, as crypto.randomUUID() gives: the
 * request's id (the access line's reqId, the upstream's x-request-id). The same entropy as
 * randomUUID (a CSPRNG pool refilled every 128 ids), written into one fixed buffer and
 * read out as a single 36-character string: Node's randomUUID builds its text by 20
 * concatenations, about 500 bytes of garbage per request (docs/performance.md, session 13).
 * The pool's bytes are not secret once used: the id is logged and sent.
 */
export function requestId(): string {
  if (nextId === POOL_IDS) {
    randomFillSync(pool);
    nextId = 0;
  }
  const o = 16 * nextId++;
  let j = 0;
  for (let i = 0; i < 16; i++) {
    if (i === 4 || i === 6 || i === 8 || i === 10) text[j++] = 0x2d;
    let b = pool[o + i] as number;
    if (i === 6) b = (b & 0x0f) | 0x40; // version 4
    else if (i === 8) b = (b & 0x3f) | 0x80; // variant 10
    text[j++] = HEX[b >> 4] as number;
    text[j++] = HEX[b & 0x0f] as number;
  }
  return text.toString('latin1', 0, 36);
}
