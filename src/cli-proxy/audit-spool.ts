import { unlinkSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { auditEventFileName, auditEventSchema, DEFAULT_AUDIT_MAX_EVENTS, DROPPED_FILE, listAuditSpool, readDroppedCount, SPOOL_FILE, spoolFileSchema, type AuditEvent } from '../data/audit-event.js';
import { atomicWrite, atomicWriteSync, sweepStaleTemps } from '../fs/atomic-write.js';
import type { Logger } from '../log/logger.js';
import { hookEnabled } from '../service/test-hooks.js';

export interface AuditSpoolConfig {
  dir: string;
  /** The bound: past it the oldest events are deleted and counted in dropped.json. */
  maxEvents: number;
  /** Events waiting in memory for their write (default 10 000); past it new ones are shed and counted. */
  maxQueued?: number;
}

/**
 * Up to ~1 KB of memory each while queued. Each write is synchronous, within the turn that
 * recorded it, so events wait here only behind one that awaits the disk: the listing of a
 * full spool (once per tenth of the bound). Bounded all the same: a listing that hangs
 * must not grow the process without end.
 */
export const DEFAULT_AUDIT_MAX_QUEUED = 10_000;

export { DEFAULT_AUDIT_MAX_EVENTS };

/**
 * The cli-proxy's side of the audit spool (SPEC §9): one atomic file per event, 0640 in a
 * setgid directory so the link (group agent-connectors-renew) can read and delete it.
 * Writes are queued one after the other, after the response: a CLI call is answered before
 * its event is written, and a failed write costs that event only (logged), never the call.
 */
export class AuditSpool {
  readonly #config: AuditSpoolConfig;
  readonly #log: Logger;
  #tail: Promise<void> = Promise.resolve();
  /** An upper bound on the files on disk: the link deletes behind our back, so a full count is re-checked. */
  #count = 0;
  #dropped = 0;
  #failing = false;
  /** The spool's names, oldest first, as last listed plus what was written since. */
  #oldest: string[] = [];
  /** How many more drops may use `#oldest` before the directory is listed again. */
  #trusted = 0;
  /** How many the current full episode has dropped; undefined while the spool has room. */
  #episodeDropped: number | undefined;
  /** Events recorded and not yet written (or failed). */
  #queued = 0;
  /** Shed from a full queue and not yet added to dropped.json. */
  #shed = 0;
  /** How many the current queue-full episode has shed; undefined while the queue has room. */
  #shedInEpisode: number | undefined;

  /** Test-only (hook `audit-hold-writes`): every write waits for this until SIGUSR2. */
  #held: Promise<void> | undefined;

  constructor(config: AuditSpoolConfig, log: Logger) {
    this.#config = config;
    this.#log = log;
    // A test of the queue's gauge holds the writes for as long as it needs, instead of
    // hoping the disk is slow enough for calls to overtake them.
    if (hookEnabled('audit-hold-writes')) {
      this.#held = new Promise((resolve) =>
        process.once('SIGUSR2', () => {
          log.warn('test hook: audit writes released');
          this.#held = undefined;
          resolve();
        }),
      );
    }
  }

  /** Events recorded and not yet written (or failed): 0 when everything so far is on disk. */
  get queued(): number {
    return this.#queued;
  }

  /** Creates the directory if missing, removes what a killed writer left, reads the counters. */
  async open(): Promise<void> {
    // No setgid bit in the mode: the units' RestrictSUIDSGID= answers any mkdir that asks
    // for one with EPERM, even for a directory that exists. tmpfiles.d creates it 2770.
    await mkdir(this.#config.dir, { recursive: true, mode: 0o770 });
    const swept = await sweepStaleTemps(this.#config.dir);
    if (swept.length > 0) this.#log.info({ removed: swept.length }, 'audit spool: removed partial writes of a killed process');
    this.#count = (await listAuditSpool(this.#config.dir)).length;
    this.#dropped = await readDroppedCount(this.#config.dir);
    // For doctor, which cannot see this process's flags; a spool that cannot take it takes no events either (open fails).
    const bound = spoolFileSchema.parse({ maxEvents: this.#config.maxEvents });
    await atomicWrite(join(this.#config.dir, SPOOL_FILE), `${JSON.stringify(bound)}\n`, { mode: 0o640 });
  }

  /**
   * Queues the event's write. Past `maxQueued` waiting (the disk behind a burst) the event
   * is shed instead: the newest, not the oldest, since those are already on their way to
   * disk; counted in dropped.json with the next write, logged once per episode.
   */
  record(event: AuditEvent): void {
    if (this.#queued >= (this.#config.maxQueued ?? DEFAULT_AUDIT_MAX_QUEUED)) {
      this.#shed += 1;
      if (this.#shedInEpisode === undefined) this.#log.warn({ maxQueued: this.#config.maxQueued ?? DEFAULT_AUDIT_MAX_QUEUED }, 'audit queue full: the disk is behind; new events dropped');
      this.#shedInEpisode = (this.#shedInEpisode ?? 0) + 1;
      return;
    }
    if (this.#shedInEpisode !== undefined) {
      this.#log.info({ droppedInEpisode: this.#shedInEpisode }, 'audit queue has room again');
      this.#shedInEpisode = undefined;
    }
    this.#queued += 1;
    this.#tail = this.#tail.then(() => this.#write(event)).finally(() => void (this.#queued -= 1));
  }

  /** Resolves once every recorded event is on disk (or has failed), and every drop counted: for shutdown. */
  async flush(): Promise<void> {
    await this.#tail;
    try {
      if (this.#shed > 0) this.#countShed();
    } catch (err) {
      this.#log.error({ err: { message: (err as Error).message } }, 'audit drop count not saved');
    }
  }

  #countShed(): void {
    this.#dropped += this.#shed;
    this.#shed = 0;
    this.#saveDropped();
  }

  /**
   * Like an event, synchronous and not fsynced (atomicWriteSync): whole or absent to the
   * link and across a crash of this process, and still renamed into place before the
   * deletes it counts, so a crash over-counts, never under-counts. A power loss can undo
   * the last ~30 s of it, as it can undo the last events, which were never counted either:
   * an fsync here bought nothing the spool promises, and at one per drop (two with the
   * directory's, through libuv's pool) it held a full spool to a few hundred events a
   * second, at ~1.3 ms of CPU each, while the calls queued their events in memory.
   */
  #saveDropped(): void {
    atomicWriteSync(join(this.#config.dir, DROPPED_FILE), `${JSON.stringify({ dropped: this.#dropped })}\n`, { mode: 0o640 });
  }

  async #write(event: AuditEvent): Promise<void> {
    if (this.#held) await this.#held;
    try {
      const checked = auditEventSchema.parse(event);
      if (this.#shed > 0) this.#countShed();
      if (this.#count >= this.#config.maxEvents) await this.#makeRoom();
      const name = auditEventFileName(checked);
      // Synchronous and not fsynced (atomicWriteSync says why): the event still survives a
      // crash of either process, and the link removes an empty file a power loss may leave.
      atomicWriteSync(join(this.#config.dir, name), `${JSON.stringify(checked)}\n`, {
        mode: 0o640,
        // Test-only: the crash test SIGKILLs the process here, half an event in a temp file.
        ...(hookEnabled('audit-pause-mid-write') ? { midWrite: () => this.#pauseMidWrite() } : {}),
      });
      this.#count += 1;
      if (this.#trusted > 0) this.#oldest.push(name);
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

  /**
   * Oldest first, down to one below the bound. The directory is listed when the count
   * reaches the bound; while it is really full (the link away), the listing is trusted for
   * the next tenth of the bound, so a full spool costs a listing per ~1 000 calls, not per
   * call. The counter is persisted before the deletes: a crash over-counts, never
   * under-counts; so does a file the link had just uploaded (then the listing is redone).
   *
   * Logged once per episode, not per drop: one warning when the spool first overflows,
   * one info line when a listing finds room again (with what the episode dropped). While
   * the link is away for a day a per-drop line would be one per CLI call, and even a
   * once-a-minute reminder would repeat what dropped.json, doctor and status already count.
   */
  async #makeRoom(): Promise<void> {
    const max = this.#config.maxEvents;
    if (this.#trusted <= 0) {
      this.#oldest = await listAuditSpool(this.#config.dir);
      this.#count = this.#oldest.length;
      this.#trusted = Math.max(1, Math.floor(max / 10));
    }
    const excess = this.#count - max + 1;
    if (excess <= 0) {
      this.#trusted = 0;
      if (this.#episodeDropped !== undefined) {
        this.#log.info({ droppedInEpisode: this.#episodeDropped, droppedTotal: this.#dropped, maxEvents: max }, 'audit spool has room again');
        this.#episodeDropped = undefined;
      }
      return;
    }
    this.#trusted -= 1;
    const victims = this.#oldest.splice(0, excess);
    this.#dropped += victims.length;
    this.#saveDropped();
    // Synchronous, as the writes: one unlink is a few µs, and a hop to the pool and back cost more.
    for (const name of victims) {
      try {
        unlinkSync(join(this.#config.dir, name));
      } catch {
        this.#trusted = 0; // the link is taking files again: look before dropping more
      }
    }
    this.#count -= victims.length;
    if (this.#episodeDropped === undefined) this.#log.warn({ dropped: victims.length, droppedTotal: this.#dropped, maxEvents: max }, 'audit spool full: oldest events dropped');
    this.#episodeDropped = (this.#episodeDropped ?? 0) + victims.length;
  }
}

