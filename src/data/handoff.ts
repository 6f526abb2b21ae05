import type { Stats } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { readBoundedRegularFile, readBoundedText, UnsafeFileError } from '../fs/bounded-read.js';
import { DESIRED_STATE_FILE } from './desired-state.js';
import { parseJsonWith } from './parse.js';
import { renewOkSchema, rfc3339Schema, slotIdSchema, tokenIdSchema } from './renew-wire.js';

/**
 * The hand-off directory between `renew fetch` and `renew apply` (SPEC §4):
 *   slots/slots.manifest  written by apply's reconcile: the ids of every slot of the state
 *                      in force, one file (docs/design/scale-handoff.md, part 1)
 *   slots/<slot>.json  written by apply once a slot holds a token or is revoked (and by
 *                      bind): what is applied, no secret. The slots are the union of the
 *                      manifest's ids and these files; a file wins over its manifest entry,
 *                      a manifest id without a file is an empty slot (`emptySlotFile`)
 *   inbox/batch-<seq>-<rand>.json  written by fetch (0640): `{v:1, entries:[...]}`, each
 *                      entry a 200 body or a revocation notice (one file per group commit)
 *   inbox/<slot>.json  what a link before the batches wrote (one answer): apply still drains it
 *   rejected/          invalid inbox files moved aside by apply, never lost
 *   desired-state.json written by the link on an enrolled host: the Gateway's whole
 *                      desired state (data/desired-state.ts), for apply to reconcile
 * Slot ids keep their colon in file names.
 */
export interface HandoffPaths {
  root: string;
  slots: string;
  inbox: string;
  rejected: string;
  desiredState: string;
}

/**
 * The hand-off root's mode as tmpfiles.d makes it: group-writable for the link, setgid so
 * its files keep the hand-off group, and sticky, so the link's group may add entries but
 * not rename or remove apply's (inbox/, slots/, rejected/): without it a link could swap
 * rejected/ for a symlink between apply's check and its rename into it.
 */
export const HANDOFF_ROOT_MODE = 0o3770;

export function handoffPaths(root: string): HandoffPaths {
  return {
    root,
    slots: join(root, 'slots'),
    inbox: join(root, 'inbox'),
    rejected: join(root, 'rejected'),
    desiredState: join(root, DESIRED_STATE_FILE),
  };
}

export const slotFileSchema = z.strictObject({
  slot: slotIdSchema,
  tokenId: tokenIdSchema.nullable(),
  expiresAt: rfc3339Schema.nullable(),
  generation: z.number().int().min(0),
  /** When apply wrote the token; with expiresAt it gives fetch the lifetime. Our extension. */
  appliedAt: rfc3339Schema.nullable().optional(),
  /** Set by apply when fetch reported the slot revoked (Gateway 404). Our extension. */
  revoked: z.boolean().optional(),
});

export type SlotFile = z.infer<typeof slotFileSchema>;

/** fetch's notice that the Gateway no longer knows a slot (our extension of the inbox). */
export const revokedNoticeSchema = z.strictObject({
  slot: slotIdSchema,
  revoked: z.literal(true),
  at: rfc3339Schema,
});

export const inboxFileSchema = z.union([renewOkSchema.strict(), revokedNoticeSchema]);
export type InboxFile = z.infer<typeof inboxFileSchema>;

/**
 * The inbox batch (docs/design/scale-handoff.md, part 2): the answers of one group commit
 * of the link, in one file. The envelope is checked whole; each entry is checked on its own
 * by apply (`inboxFileSchema`), so one bad entry is rejected alone.
 */
export const INBOX_BATCH_VERSION = 1;
/**
 * Entries per batch: the link never has more than its renewal concurrency (32 by default,
 * at most a few hundred) answers waiting, so this bound is never what splits a group.
 */
export const MAX_BATCH_ENTRIES = 512;
/**
 * A batch file's byte bound (apply refuses anything larger unread). An entry is a token
 * (at most 16 KiB, usually well under 1 KiB) and its metadata: 512 typical entries are a
 * few hundred KiB; the link splits a group that would pass `MAX_BATCH_WRITE_BYTES`.
 */
export const MAX_BATCH_FILE_BYTES = 4 * 1024 * 1024;
/** What the link puts in one file at most: below apply's bound, one entry's bound of slack. */
export const MAX_BATCH_WRITE_BYTES = MAX_BATCH_FILE_BYTES - 128 * 1024;

export const inboxBatchSchema = z.strictObject({
  v: z.literal(INBOX_BATCH_VERSION),
  entries: z.array(z.unknown()).min(1).max(MAX_BATCH_ENTRIES),
});

/** `batch-<16 digits>-<12 hex>.json`: never a slot id (no colon), sorts by its sequence. */
const BATCH_NAME = /^batch-\d{16}-[0-9a-f]{12}\.json$/;

export function isBatchFileName(name: string): boolean {
  return BATCH_NAME.test(name);
}

export function batchFileName(sequence: number, random: string): string {
  return `batch-${String(sequence).padStart(16, '0')}-${random}.json`;
}

export function slotFileName(slot: string): string {
  return `${slot}.json`;
}

/** Slot id of an inbox/slots file name, or undefined for anything else (temp files, junk). */
export function slotOfFileName(name: string): string | undefined {
  if (name.startsWith('.') || !name.endsWith('.json')) return undefined;
  const slot = name.slice(0, -'.json'.length);
  return slotIdSchema.safeParse(slot).success ? slot : undefined;
}

/** A slot file is a few hundred bytes; anything past this is not one. */
export const MAX_SLOT_FILE_BYTES = 16 * 1024;

/**
 * A slot file's text: never through a symlink, never waiting on a FIFO, bounded (the
 * link, which may be hostile, can create entries in slots/). Undefined when absent.
 */
export function readSlotText(path: string): Promise<string | undefined> {
  return readBoundedText(path, MAX_SLOT_FILE_BYTES);
}

export function emptySlotFile(slot: string): SlotFile {
  return { slot, tokenId: null, expiresAt: null, generation: 0 };
}



/** One slot file's entry from its name and text: the slot, or why it is invalid; undefined for a name that is not a slot's. */
export function slotEntry(name: string, text: string): SlotFile | { error: string } | undefined {
  const slot = slotOfFileName(name);
  if (!slot) return undefined;
  const parsed = parseJsonWith(slotFileSchema, text);
  if (!parsed.ok) return { error: parsed.error };
  if (parsed.value.slot !== slot) return { error: 'slot field does not match the file name' };
  return parsed.value;
}

/**
 * The slot manifest (docs/design/scale-handoff.md, part 1): the ids of every slot of the
 * state in force, written whole by apply's reconcile (temp, fsync, rename, directory
 * fsync), so a new 10 000-binding state is one file, not 11 000. Its name never parses as
 * a slot file's (`slotOfFileName`: no `.json`), so no reader takes it for a slot.
 *
 * slots/ is group-writable for the link, so the manifest is hostile input to every reader
 * (bounded read, no symlink, no FIFO, schema). apply never takes its slot set from it: the
 * set comes from the desired state and the registry; apply reads it only to find slots it
 * put there itself (to retire them) and to know what is in force (`slotInForce`), which a
 * planted per-slot file could already claim.
 */
export const SLOT_MANIFEST_FILE = 'slots.manifest';
export const SLOT_MANIFEST_VERSION = 1;
/** 100 000 ids: ten times the largest host issue 23 asks for. */
export const MAX_MANIFEST_SLOTS = 100_000;
/**
 * A slot id is at most 137 bytes (`instance:` and 128): 100 000 of the longest, quoted and
 * comma-separated, are 14 MB. A 10 000-binding state's manifest is about 0.5 MB.
 */
export const MAX_MANIFEST_BYTES = 16 * 1024 * 1024;

export const slotManifestSchema = z.strictObject({
  v: z.literal(SLOT_MANIFEST_VERSION),
  /** The desired state's version it was written for: for a reader's log line, never a rule. */
  version: z.number().int().min(0).optional(),
  slots: z.array(slotIdSchema).max(MAX_MANIFEST_SLOTS),
});

export type SlotManifest = z.infer<typeof slotManifestSchema>;

export function slotManifestPath(paths: HandoffPaths): string {
  return join(paths.slots, SLOT_MANIFEST_FILE);
}

export function slotManifestText(slots: Iterable<string>, version?: number): string {
  const manifest: SlotManifest = { v: SLOT_MANIFEST_VERSION, ...(version === undefined ? {} : { version }), slots: [...slots].sort() };
  return `${JSON.stringify(manifest)}\n`;
}

/** A manifest's ids from its text, or why it is refused (a duplicate id too: never ours). */
export function parseSlotManifest(text: string): { ok: true; slots: Set<string> } | { ok: false; error: string } {
  const parsed = parseJsonWith(slotManifestSchema, text);
  if (!parsed.ok) return { ok: false, error: parsed.error };
  const slots = new Set(parsed.value.slots);
  if (slots.size !== parsed.value.slots.length) return { ok: false, error: 'duplicate slot id' };
  return { ok: true, slots };
}

/**
 * The manifest as read now: absent, its ids (with the fstat of what was read), or why it
 * was refused (unsafe, too large, invalid): never thrown, so a planted manifest costs the
 * readers only its own entries. Other read errors (EACCES, EIO) are thrown.
 */
export type ManifestRead = { kind: 'absent' } | { kind: 'ok'; slots: Set<string>; stat: Stats } | { kind: 'invalid'; error: string; stat?: Stats };

export async function readSlotManifest(paths: HandoffPaths): Promise<ManifestRead> {
  let file;
  try {
    file = await readBoundedRegularFile(slotManifestPath(paths), MAX_MANIFEST_BYTES);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { kind: 'absent' };
    if (err instanceof UnsafeFileError) {
      const error = err.reason === 'symlink' ? 'is a symlink (not followed)' : err.reason === 'not-regular' ? 'is not a regular file' : `is larger than ${MAX_MANIFEST_BYTES} bytes`;
      return { kind: 'invalid', error };
    }
    throw err;
  }
  const parsed = parseSlotManifest(file.text);
  return parsed.ok ? { kind: 'ok', slots: parsed.slots, stat: file.stat } : { kind: 'invalid', error: parsed.error, stat: file.stat };
}

/**
 * Every slot there is: the per-slot files (valid ones; invalid ones are reported, not
 * fatal) and the manifest's ids without a file (empty slots). A refused manifest is
 * reported as `slots.manifest`'s error and the files are still read.
 */
export async function readSlots(paths: HandoffPaths): Promise<{ slots: SlotFile[]; errors: Array<{ file: string; error: string }> }> {
  const slots: SlotFile[] = [];
  const errors: Array<{ file: string; error: string }> = [];
  let names: string[];
  try {
    names = await readdir(paths.slots);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { slots, errors };
    throw err;
  }
  const manifest = names.includes(SLOT_MANIFEST_FILE) ? await readSlotManifest(paths).catch((err: unknown) => ({ kind: 'invalid' as const, error: `unreadable (${(err as NodeJS.ErrnoException).code ?? 'error'})` })) : { kind: 'absent' as const };
  if (manifest.kind === 'invalid') errors.push({ file: SLOT_MANIFEST_FILE, error: manifest.error });
  const withFile = new Set<string>();
  for (const name of names.sort()) {
    const slot = slotOfFileName(name);
    if (!slot) continue;
    // A file there wins over the manifest, even one that cannot be read or parsed.
    withFile.add(slot);
    const text = await readSlotText(join(paths.slots, name)).catch(() => undefined);
    const entry = text === undefined ? undefined : slotEntry(name, text);
    if (entry === undefined) continue;
    if ('error' in entry) errors.push({ file: name, error: entry.error });
    else slots.push(entry);
  }
  if (manifest.kind === 'ok') for (const slot of manifest.slots) if (!withFile.has(slot)) slots.push(emptySlotFile(slot));
  slots.sort((a, b) => (a.slot < b.slot ? -1 : a.slot > b.slot ? 1 : 0));
  return { slots, errors };
}

/**
 * The ids of every slot there is, by name: the per-slot files listed and the manifest's
 * ids. `manifest` says whether the manifest could be used ('absent' and 'ok' are complete
 * answers; 'invalid' means its ids are unknown, so a caller that would forget a slot not
 * found here should not).
 */
export async function slotIdsInHandoff(paths: HandoffPaths): Promise<{ ids: Set<string>; files: Set<string>; manifest: ManifestRead['kind'] }> {
  const names = await readdir(paths.slots).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return [] as string[];
    throw err;
  });
  const files = new Set(names.flatMap((n) => slotOfFileName(n) ?? []));
  const manifest = names.includes(SLOT_MANIFEST_FILE) ? await readSlotManifest(paths).catch(() => ({ kind: 'invalid' as const, error: 'unreadable' })) : ({ kind: 'absent' } as const);
  const ids = new Set(files);
  if (manifest.kind === 'ok') for (const slot of manifest.slots) ids.add(slot);
  return { ids, files, manifest: manifest.kind };
}

export async function readSlotFile(paths: HandoffPaths, slot: string): Promise<SlotFile | undefined> {
  const text = await readSlotText(join(paths.slots, slotFileName(slot)));
  if (text === undefined) return undefined;
  const parsed = parseJsonWith(slotFileSchema, text);
  return parsed.ok && parsed.value.slot === slot ? parsed.value : undefined;
}
