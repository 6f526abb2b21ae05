import { readdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { providerNameSchema } from './catalog.js';
import { rfc3339Schema } from './renew-wire.js';
import { readBoundedText, UnsafeFileError } from '../fs/bounded-read.js';

/**
 * The audit of native_cli calls (SPEC §9) and its on-disk spool, shared by the writer
 * (the cli-proxy) and the reader (the link), which must not import each other.
 *
 *   POST {gw}/v1/host/audit  (Bearer) {"events": [<event>…], "dropped": <n>}
 *                            200 {"accepted": <n>} | 401 | 429 / 5xx: retry
 *
 * An event is the shape of one call, never a value: no query string, header, body or
 * token. The spool is one file per event, `<ms since epoch, 15 digits>-<id>.json`, so a
 * directory listing sorted by name is oldest first, each file is written atomically (a
 * reader sees a whole event or none) and deleting an accepted event is one unlink.
 * `dropped.json` holds how many events the writer has dropped since the spool was made:
 * a counter that only grows, so the upload can carry it on every batch and the Gateway
 * keeps the largest; nobody has to reset it (two writers of one file would race).
 */

export const AUDIT_PATH = '/v1/host/audit';

/**
 * Every file of the spool is a few hundred bytes. Two writers share the directory (the
 * cli-proxy and the link's group), so each reads the other's files bounded and never
 * through a FIFO or a symlink (fs/bounded-read.ts): neither can wedge or swell the other,
 * nor doctor and status, which read it as root.
 */
export const MAX_AUDIT_FILE_BYTES = 16 * 1024;

/** `rec.path` is capped at 200 characters by the cli-proxy; the schema holds it to that. */
export const auditEventSchema = z.strictObject({
  id: z.uuid(),
  time: rfc3339Schema,
  provider: providerNameSchema,
  method: z.string().regex(/^[A-Z][A-Z-]{0,15}$/, 'method must be an upper-case HTTP method'),
  /** The path below the provider's base, without query string or fragment. */
  path: z
    .string()
    .min(1)
    .max(200)
    .regex(/^\/[^?#\s]*$/, 'path must start with / and hold no query, fragment or space'),
  status: z.number().int().min(100).max(599),
  bytesIn: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  bytesOut: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  durationMs: z.number().min(0).max(1e9),
  /** The caller's UID (/proc/net/tcp); null when its socket was gone before it was read. */
  peerUid: z.number().int().min(0).max(0xffffffff).nullable(),
});

export type AuditEvent = z.infer<typeof auditEventSchema>;

/** Events per upload: ~300 bytes each, so a batch stays far below the Gateway's body limit. */
export const AUDIT_BATCH_MAX = 500;
export const AUDIT_BODY_LIMIT = 1024 * 1024;

export const auditUploadSchema = z.strictObject({
  events: z.array(auditEventSchema).min(1).max(AUDIT_BATCH_MAX),
  /** Events the host dropped from a full spool since it was created (monotonic). */
  dropped: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
});

export type AuditUpload = z.infer<typeof auditUploadSchema>;

/** The Gateway has stored the first `accepted` events of the batch (a repeated id counts). */
export const auditAnswerSchema = z.object({ accepted: z.number().int().min(0) });

export const droppedFileSchema = z.strictObject({ dropped: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER) });

export const DROPPED_FILE = 'dropped.json';

/**
 * `upload.json`, written by the link after each accepted batch (no event content), so
 * `status` can say when the spool last reached the Gateway.
 */
export const UPLOAD_STATUS_FILE = 'upload.json';
export const uploadStatusSchema = z.strictObject({ lastUploadAt: rfc3339Schema, lastAccepted: z.number().int().min(0) });
export type UploadStatus = z.infer<typeof uploadStatusSchema>;

/** The cli-proxy's default bound on the spool (`--audit-max-events`). */
export const DEFAULT_AUDIT_MAX_EVENTS = 10_000;

/**
 * `spool.json`, written by the cli-proxy when it opens the spool: the bound it enforces, so
 * doctor can tell a full spool without knowing the cli-proxy's command line.
 */
export const SPOOL_FILE = 'spool.json';
export const spoolFileSchema = z.strictObject({ maxEvents: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER) });

/** What a reader can tell of the spool without reading an event: for doctor and status. */
export interface AuditSpoolSummary {
  /** Event files waiting for the link. */
  events: number;
  /** When the oldest waiting event's request arrived (ms since epoch). */
  oldestAt?: number;
  dropped: number;
  /** The cli-proxy's bound as it last recorded it; the default when it never did. */
  maxEvents: number;
  maxEventsRecorded: boolean;
  upload?: UploadStatus;
}

export async function readAuditSpool(dir: string): Promise<AuditSpoolSummary> {
  const names = await listAuditSpool(dir);
  const bound = await readBoundedText(join(dir, SPOOL_FILE), MAX_AUDIT_FILE_BYTES)
    .then((text) => spoolFileSchema.parse(JSON.parse(text ?? '')).maxEvents)
    .catch(() => undefined);
  const upload = await readUploadStatus(dir);
  const oldest = names[0];
  return {
    events: names.length,
    ...(oldest ? { oldestAt: spooledAt(oldest) } : {}),
    dropped: await readDroppedCount(dir),
    maxEvents: bound ?? DEFAULT_AUDIT_MAX_EVENTS,
    maxEventsRecorded: bound !== undefined,
    ...(upload ? { upload } : {}),
  };
}

export async function readUploadStatus(dir: string): Promise<UploadStatus | undefined> {
  try {
    const parsed = uploadStatusSchema.safeParse(JSON.parse((await readBoundedText(join(dir, UPLOAD_STATUS_FILE), MAX_AUDIT_FILE_BYTES)) ?? ''));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

const EVENT_FILE = /^\d{15}-[0-9a-f-]{36}\.json$/;

/** When a spooled event's request arrived (ms since epoch), from its file name. */
export function spooledAt(name: string): number {
  return Number(name.slice(0, 15));
}

export function auditEventFileName(event: AuditEvent): string {
  return `${String(Date.parse(event.time)).padStart(15, '0')}-${event.id}.json`;
}

/** The spooled events' file names, oldest first (temp files, starting with a dot, are not events). */
export async function listAuditSpool(dir: string): Promise<string[]> {
  const names = await readdir(dir).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return [] as string[];
    throw err;
  });
  return names.filter((n) => EVENT_FILE.test(n)).sort();
}

export type SpooledEvent = { name: string; event: AuditEvent } | { name: string; invalid: string };

/** Reads one spooled event; a file that vanished (dropped meanwhile) is undefined. */
export async function readSpooledEvent(dir: string, name: string): Promise<SpooledEvent | undefined> {
  let text: string | undefined;
  try {
    text = await readBoundedText(join(dir, name), MAX_AUDIT_FILE_BYTES);
  } catch (err) {
    if (err instanceof UnsafeFileError) return { name, invalid: err.reason };
    throw err;
  }
  if (text === undefined) return undefined;
  try {
    const parsed = auditEventSchema.safeParse(JSON.parse(text));
    return parsed.success ? { name, event: parsed.data } : { name, invalid: 'not an audit event' };
  } catch {
    return { name, invalid: 'not JSON' };
  }
}

export async function removeSpooledEvent(dir: string, name: string): Promise<void> {
  await unlink(join(dir, name)).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'ENOENT') throw err;
  });
}

/** The writer's dropped counter; 0 when there is none yet (or it cannot be read). */
export async function readDroppedCount(dir: string): Promise<number> {
  try {
    const parsed = droppedFileSchema.safeParse(JSON.parse((await readBoundedText(join(dir, DROPPED_FILE), MAX_AUDIT_FILE_BYTES)) ?? ''));
    return parsed.success ? parsed.data.dropped : 0;
  } catch {
    return 0;
  }
}
