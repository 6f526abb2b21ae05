import { mkdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { auditEventFileName, auditEventSchema, DROPPED_FILE, listAuditSpool, readDroppedCount, type AuditEvent } from '../data/audit-event.js';
import { atomicWrite, sweepStaleTemps } from '../fs/atomic-write.js';
import type { Logger } from '../log/logger.js';
import { hookEnabled } from '../service/test-hooks.js';

export interface AuditSpoolConfig {
  dir: string;
  /** The bound: past it the oldest events are deleted and counted in dropped.json. */
  maxEvents: number;
}

export const DEFAULT_AUDIT_MAX_EVENTS = 10_000;

/**
 * The cli-proxy's side of the audit spool (SPEC §9): one atomic file per event, 0640 in a
 * setgid directory so the link (group agent-connectors-renew) can read and delete it.
 * Writes are queued one after the other, after the response: a slow disk never delays a
 * CLI call, and a failed write costs that event only (logged), never the call.
 */
export class AuditSpool {
  readonly #config: AuditSpoolConfig;
  readonly #log: Logger;
  #tail: Promise<void> = Promise.resolve();
  /** An upper bound on the files on disk: the link deletes behind our back, so a full count is re-checked. */
  #count = 0;
  #dropped = 0;
  #failing = false;

  constructor(config: AuditSpoolConfig, log: Logger) {
    this.#config = config;
    this.#log = log;
  }

  /** Creates the directory if missing, removes what a killed writer left, reads the counters. */
  async open(): Promise<void> {
    await mkdir(this.#config.dir, { recursive: true, mode: 0o2770 });
    const swept = await sweepStaleTemps(this.#config.dir);
    if (swept.length > 0) this.#log.info({ removed: swept.length }, 'audit spool: removed partial writes of a killed process');
    this.#count = (await listAuditSpool(this.#config.dir)).length;
    this.#dropped = await readDroppedCount(this.#config.dir);
  }

  record(event: AuditEvent): void {
    this.#tail = this.#tail.then(() => this.#write(event));
  }

  /** Resolves once every recorded event is on disk (or has failed): for shutdown. */
  async flush(): Promise<void> {
    await this.#tail;
  }

  async #write(event: AuditEvent): Promise<void> {
    try {
      const checked = auditEventSchema.parse(event);
      if (this.#count >= this.#config.maxEvents) await this.#makeRoom();
      await atomicWrite(join(this.#config.dir, auditEventFileName(checked)), `${JSON.stringify(checked)}\n`, {
        mode: 0o640,
        // Test-only: the crash test SIGKILLs the process here, half an event in a temp file.
        ...(hookEnabled('audit-pause-mid-write') ? { midWrite: () => this.#pauseMidWrite() } : {}),
      });
      this.#count += 1;
      if (this.#failing) this.#log.info('audit spool writable again');
      this.#failing = false;
    } catch (err) {
      // Once per streak: a full disk must not turn every CLI call into an error line.
      if (!this.#failing) this.#log.error({ err: { code: (err as NodeJS.ErrnoException).code, message: (err as Error).message } }, 'audit event not spooled');
      this.#failing = true;
    }
  }

  #pauseMidWrite(): void {
    // The logger writes synchronously (pending access lines first), so the test sees both.
    this.#log.warn('test hook: audit write paused mid-file');
    // Blocks this thread for good: the test kills the process here.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
  }

  /** Oldest first, down to one below the bound; the counter is persisted before the deletes so a crash over-counts, never under-counts. */
  async #makeRoom(): Promise<void> {
    const names = await listAuditSpool(this.#config.dir);
    const excess = names.length - this.#config.maxEvents + 1;
    if (excess <= 0) {
      this.#count = names.length;
      return;
    }
    this.#dropped += excess;
    await atomicWrite(join(this.#config.dir, DROPPED_FILE), `${JSON.stringify({ dropped: this.#dropped })}\n`, { mode: 0o640 });
    for (const name of names.slice(0, excess)) await unlink(join(this.#config.dir, name)).catch(() => undefined);
    this.#count = names.length - excess;
    this.#log.warn({ dropped: excess, droppedTotal: this.#dropped, maxEvents: this.#config.maxEvents }, 'audit spool full: oldest events dropped');
  }
}

