/**
 * The large body's content: one deterministic 64 KiB block repeated, so a reader can check
 * every byte against its offset without the upstream sending a digest.
 */
export const BLOCK_SIZE = 64 * 1024;

export function patternBlock(): Buffer {
  const b = Buffer.allocUnsafe(BLOCK_SIZE);
  let x = 0x2545f491;
  for (let i = 0; i < BLOCK_SIZE; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    b[i] = x >>> 24;
  }
  return b;
}

/** Checks a stream chunk by chunk against the pattern; remembers the first mismatch. */
export class PatternChecker {
  private readonly block = patternBlock();
  offset = 0;
  firstMismatch: number | undefined;

  update(chunk: Buffer): void {
    if (this.firstMismatch !== undefined) {
      this.offset += chunk.length;
      return;
    }
    let j = 0;
    while (j < chunk.length) {
      const pos = this.offset % BLOCK_SIZE;
      const len = Math.min(BLOCK_SIZE - pos, chunk.length - j);
      if (chunk.compare(this.block, pos, pos + len, j, j + len) !== 0) {
        this.firstMismatch = this.offset;
        this.offset += chunk.length - j;
        return;
      }
      j += len;
      this.offset += len;
    }
  }
}
