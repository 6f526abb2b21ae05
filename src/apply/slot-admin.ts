import { performance } from 'node:perf_hooks';
import { lstatSync, watch, type FSWatcher } from 'node:fs';
import { basename, join } from 'node:path';
import { emptySlotFile, readSlotFile, readSlotManifest, slotFileName, slotManifestPath, slotManifestText, type HandoffPaths, type SlotFile } from '../data/handoff.js';
import { atomicWrite, atomicWriteSync, fsyncDir } from '../fs/atomic-write.js';
import { deleteFile } from '../fs/delete-file.js';
import { ensureHandoffDir, handoffOwners } from './handoff-dirs.js';

/**
 * The slot files this process knows to be valid and not revoked (it wrote or read them),
 * by path, with the file's identity then (inode, size, mtime and ctime in ns). A new state
 * then reads only the files it does not know: with 10 000 in force, one binding
 * disconnected read 10 000 slot files to find the revoked ones. Every write in slots/
 * (apply's, `bind`'s, a planted file) is a rename to a new inode or changes the size or
 * ctime, so a file someone else changed no longer matches and is read again. Per process:
 * at start (and after a power loss) it is empty and everything is read once.
 *
 * Beside the identity it keeps the content: apply compares each inbox file with the slot
 * in force, and reading and parsing the file it had itself written a moment before was a
 * fifth of its work per token. The same identity check decides whether that content is
 * still the file's. `delete` forgets both.
 */
class KnownSlots {
  readonly #good = new Map<string, string>();
  readonly #contents = new Map<string, { identity: string; slot: SlotFile }>();

  get(path: string): string | undefined {
    return this.#good.get(path);
  }

  set(path: string, identity: string): void {
    this.#good.set(path, identity);
  }

  delete(path: string): void {
    this.#good.delete(path);
    this.#contents.delete(path);
  }

  /** What the file at `path` held when its identity was `identity` (revoked or not). */
  keep(path: string, identity: string, slot: SlotFile): void {
    this.#contents.set(path, { identity, slot });
  }

  contentOf(path: string, identity: string): SlotFile | undefined {
    const kept = this.#contents.get(path);
    return kept?.identity === identity ? kept.slot : undefined;
  }
}
const knownGood = new KnownSlots();

function identityOf(path: string): string | undefined {
  const st = lstatSync(path, { bigint: true, throwIfNoEntry: false });
  return st?.isFile() ? `${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}` : undefined;
}

/** `identity`: taken before a read, so a file replaced after it fails the next match. */
function remember(path: string, slot: SlotFile | undefined, identity = identityOf(path)): void {
  if (slot && !slot.revoked && identity !== undefined) knownGood.set(path, identity);
  else knownGood.delete(path);
  if (slot && identity !== undefined) knownGood.keep(path, identity, slot);
}

function isKnownGood(path: string): boolean {
  const known = knownGood.get(path);
  if (known === undefined) return false;
  if (identityOf(path) === known) return true;
  knownGood.delete(path);
  return false;
}

/**
 * Which known-good slot files a new state must look at again: the ones something touched
 * since the last look, by an inotify watch of slots/ (`fs.watch`, which names the entry for
 * every create, write, attribute change, rename and delete in the directory, whoever did
 * it). With 10 000 in force the check of every known file (an lstat each) was ~10 % of
 * apply's CPU in the renewal burst, one state per disconnect; now a state looks at the
 * files written since the last one (apply's own token writes among them: still one lstat
 * each, which finds them as apply left them).
 *
 * What keeps it as safe as the lstat of every file:
 * - A change completed before the check is seen: the kernel queues the event with the
 *   write, and the check first lets the event loop run a full turn (`settled`), which
 *   reads every queued event.
 * - The watch starts with a full check, and so does a new watch after an error (slots/
 *   removed or replaced, an event without a name).
 * - node does not report an inotify queue overflow (libuv drops `IN_Q_OVERFLOW`): the
 *   full check also runs when the last one is older than `FULL_CHECK_MS`, which bounds how
 *   long a lost event can hide a change. apply's own writes are most of the events (≈ 5
 *   per slot file), and it takes a loop turn every 256 of them (here and in the inbox's
 *   waves), far below the 16 384 queued by default.
 * - `healInForce` at every start reads every file, as before.
 */
const FULL_CHECK_MS = 60_000;
const MAX_TOUCHED = 100_000;

interface SlotsWatch {
  watcher: FSWatcher;
  /** slots/'s identity when the watch was set. */
  dir: string;
  /** Paths touched since they were last looked at; `full`: look at every one. */
  touched: Set<string>;
  full: boolean;
  lastFull: number;
}
const watches = new Map<string, SlotsWatch>();

/** slots/ itself, by inode: a watch is of the directory it was set on, not of the path. */
const dirIdentity = (dir: string): string | undefined => {
  const st = lstatSync(dir, { throwIfNoEntry: false });
  return st?.isDirectory() ? `${st.dev}:${st.ino}` : undefined;
};

function watchOf(dir: string): SlotsWatch | undefined {
  const existing = watches.get(dir);
  // slots/ removed or replaced (only root can: the hand-off root is sticky): a new watch.
  if (existing && existing.dir === dirIdentity(dir)) return existing;
  if (existing) {
    existing.watcher.close();
    watches.delete(dir);
  }
  const identity = dirIdentity(dir);
  if (identity === undefined) return undefined;
  let w: SlotsWatch;
  const lost = (): void => {
    w.watcher.close();
    if (watches.get(dir) === w) watches.delete(dir);
  };
  try {
    const watcher = watch(dir, { persistent: false, encoding: 'utf8' }, (_event, name) => {
      // No name: the watched directory itself went (or an event node could not name).
      if (!name || name === basename(dir)) return lost();
      // Only what can be a slot file (`slotOfFileName`'s cheap half): not the temp files
      // (`.<name>.<pid>.<random>.tmp`, one new name per write) nor the manifest. Names
      // created faster than states come (only the link's group could) end in a full look.
      if (name.startsWith('.') || !name.endsWith('.json')) return;
      if (w.touched.size >= MAX_TOUCHED) Object.assign(w, { full: true, touched: new Set() });
      else w.touched.add(join(dir, name));
    });
    w = { watcher, dir: identity, touched: new Set(), full: true, lastFull: 0 };
  } catch {
    return undefined;
  }
  w.watcher.on('error', lost);
  watches.set(dir, w);
  return w;
}

/** A full turn of the event loop (its poll phase included): every event already queued is read. */
const settled = (): Promise<void> => new Promise((resolve) => setImmediate(() => setImmediate(resolve)));

/**
 * The slot in force, as `readSlotFile` returns it, without reading a file this process
 * wrote or read and nobody changed since: one lstat instead of a read and a parse. Only
 * apply writes slots/ while it runs, but `bind`, an operator or a planted file may too;
 * those change the identity and are read again. Anything but a regular file (missing, a
 * symlink, a FIFO) is left to `readSlotFile` to judge.
 */
export async function slotInForce(paths: HandoffPaths, slot: string): Promise<SlotFile | undefined> {
  const path = join(paths.slots, slotFileName(slot));
  const identity = identityOf(path);
  if (identity !== undefined) {
    const kept = knownGood.contentOf(path, identity);
    if (kept) return kept;
  } else if (lstatSync(path, { throwIfNoEntry: false }) === undefined) {
    // No file: a slot of the manifest is in force, empty (no token applied yet).
    return (await manifestSlots(paths)).has(slot) ? emptySlotFile(slot) : undefined;
  }
  const read = await readSlotFile(paths, slot);
  // Unreadable or another slot's content: not kept, so it is judged again next time.
  if (read && identity !== undefined) remember(path, read, identity);
  return read;
}

/**
 * The manifest's ids as this process last wrote or read it, keyed by the file's identity
 * (as `knownGood`): a token for an empty slot costs an lstat, not a read and parse of a
 * 0.5 MB file. A manifest apply cannot use (refused, invalid, or not owned by apply: the
 * link's group can create entries in slots/) names no slot; the caller's own sources (the
 * desired state, the registry) decide what matters, this only answers "in force?" as a
 * planted per-slot file already could.
 */
let manifestKnown: { path: string; identity: string; ids: ReadonlySet<string> } | undefined;

export async function manifestSlots(paths: HandoffPaths): Promise<ReadonlySet<string>> {
  const path = slotManifestPath(paths);
  const identity = identityOf(path);
  if (identity === undefined) return new Set();
  if (manifestKnown?.path === path && manifestKnown.identity === identity) return manifestKnown.ids;
  const read = await readSlotManifest(paths);
  if (read.kind !== 'ok') return new Set();
  const owners = await handoffOwners(paths.root);
  if (!owners.has(read.stat.uid)) return new Set();
  // Kept only if the file read is the one lstat saw before (a rename since: read again next time).
  manifestKnown = identityOf(path) === identity && read.stat.ino === Number(identity.split(':')[0]) ? { path, identity, ids: read.slots } : undefined;
  return read.slots;
}

/**
 * Writes the slot manifest whole (temp, fsync, rename, fsync of slots/): what the link
 * renews. Skipped when the file already holds exactly these ids (a state that changes no
 * slot, a restart). Returns whether it wrote.
 */
export async function writeManifest(paths: HandoffPaths, slots: ReadonlySet<string>, version?: number): Promise<boolean> {
  const path = slotManifestPath(paths);
  const current = await manifestSlots(paths);
  if (manifestKnown?.path === path && current.size === slots.size && [...slots].every((s) => current.has(s))) return false;
  // Never through a symlink the link planted in place of slots/.
  await ensureHandoffDir(paths, 'slots');
  manifestKnown = undefined;
  await atomicWrite(path, slotManifestText(slots, version), { mode: SLOT_FILE_MODE });
  const identity = identityOf(path);
  if (identity !== undefined) manifestKnown = { path, identity, ids: new Set(slots) };
  return true;
}

/** Removes the manifest (a host revocation: no slot is in force). */
export async function removeManifest(paths: HandoffPaths): Promise<boolean> {
  manifestKnown = undefined;
  const removed = await deleteFile(slotManifestPath(paths));
  if (removed) await fsyncDir(paths.slots);
  return removed;
}

export interface WriteSlotOptions {
  /**
   * slots/ was checked by the caller for this batch of writes (`ensureHandoffDir`): the
   * hand-off root is sticky, so the link cannot swap a checked directory for a symlink.
   */
  dirChecked?: boolean;
  /**
   * No fsync of the file: it is still whole or absent to every reader and across a crash
   * of the process, and the caller makes the rename durable with `fsyncDir(paths.slots)`.
   * For apply's inbox, whose token file is on disk before the slot file says it is
   * applied: after a power cut the slot file can only say less than what is on disk
   * (see `applyInbox`).
   */
  noFsync?: boolean;
}

export async function writeSlotFile(paths: HandoffPaths, slot: SlotFile, options: WriteSlotOptions = {}): Promise<void> {
  // Never through a symlink the link planted in place of slots/.
  if (!options.dirChecked) await ensureHandoffDir(paths, 'slots');
  const path = join(paths.slots, slotFileName(slot.slot));
  knownGood.delete(path);
  // 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it.
  if (options.noFsync) atomicWriteSync(path, `${JSON.stringify(slot)}\n`, { mode: 0o640 });
  else await atomicWrite(path, `${JSON.stringify(slot)}\n`, { mode: 0o640 });
  remember(path, slot);
}

export { deleteFile };

/** `bind`: make the slot known to fetch (no token yet → renewed at once). Idempotent. */
export async function ensureSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  const existing = await readSlotFile(paths, slot);
  if (existing && !existing.revoked) return false;
  await writeSlotFile(paths, existing ? { ...existing, revoked: undefined } : emptySlotFile(slot));
  return true;
}

/**
 * Each slot file is its own durable write (two fsyncs); one after the other, a state of
 * 10 000 new bindings spent minutes waiting on the disk. A few at a time keep the disk
 * busy without holding thousands of open files.
 */
const IN_FLIGHT = 16;
export async function eachInParallel<T>(items: readonly T[], fn: (item: T) => Promise<unknown>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) await fn(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(IN_FLIGHT, items.length) }, worker));
}

/** Between two runs of this many synchronous writes, the loop takes its other work (the watchdog, a signal). */
const SYNC_BATCH = 256;

export interface EnsureSlotsResult {
  /** The slots whose file was written again (unreadable or revived). */
  written: string[];
  /** Slot files read: the present ones this process did not already know to be good. */
  read: number;
  /** Slot files looked at (an lstat): all at a full look, else the ones touched since the last (`SlotsWatch`). */
  looked: number;
}

export interface EnsureSlotsOptions {
  /** false: a revoked file is left revoked (`healInForce`: only a new state revives). */
  revive?: boolean;
  /**
   * The clock `FULL_CHECK_MS` is counted on, in ms. Monotonic (`performance.now`): a step
   * of the wall clock neither forces nor postpones a full look. A test gives its own, to
   * pass the 60 s without waiting them.
   */
  now?: () => number;
}

/**
 * The per-slot files of a desired state's slots that exist (`present`: the names listed in
 * slots/): each unreadable one is written again empty, each revoked one revived (unless
 * `revive: false`). A slot with no file needs nothing here: the manifest names it
 * (`writeManifest`), and its file is written only once it holds a token or is revoked
 * (apply's inbox). A file this process knows unchanged since it wrote or read it is not
 * read. The rewrites are whole-or-absent (temp + rename) without an fsync each; one fsync
 * of slots/ makes the renames durable, and a file whose content a power loss lost is
 * re-made by the next reconcile (apply runs one at every start: `reconcileDesiredState`).
 */
export async function ensureSlots(paths: HandoffPaths, slots: readonly string[], present: ReadonlySet<string>, options: EnsureSlotsOptions = {}): Promise<EnsureSlotsResult> {
  const { now = () => performance.now() } = options;
  const write: SlotFile[] = [];
  const w = watchOf(paths.slots);
  let full = true;
  if (w) {
    await settled();
    const at = now();
    full = w.full || at - w.lastFull >= FULL_CHECK_MS;
    // From here on, what is touched is for the next look (a change during this one included).
    if (full) Object.assign(w, { full: false, lastFull: at });
  }
  const looked = new Set<string>();
  const unknown = slots.filter((s) => {
    if (!present.has(s)) return false;
    const path = join(paths.slots, slotFileName(s));
    if (full || !w || w.touched.has(path) || knownGood.get(path) === undefined) {
      looked.add(path);
      return !isKnownGood(path);
    }
    return false;
  });
  if (w) {
    if (full) w.touched.clear();
    // A touched path not looked at stays for the next look, unless nothing is known of it
    // (a removed slot, a name that is no slot's: read whenever it is wanted).
    else for (const path of w.touched) if (looked.has(path) || knownGood.get(path) === undefined) w.touched.delete(path);
  }
  await eachInParallel(unknown, async (slot) => {
    const path = join(paths.slots, slotFileName(slot));
    const identity = identityOf(path);
    const existing = await readSlotFile(paths, slot).catch(() => undefined);
    remember(path, existing, identity);
    if (!existing) write.push(emptySlotFile(slot));
    else if (existing.revoked && options.revive !== false) write.push({ ...existing, revoked: undefined });
  });
  const result = { written: write.map((s) => s.slot), read: unknown.length, looked: looked.size };
  if (write.length === 0) return result;
  // Never through a symlink the link planted in place of slots/.
  await ensureHandoffDir(paths, 'slots');
  for (let i = 0; i < write.length; i++) {
    if (i > 0 && i % SYNC_BATCH === 0) await new Promise((resolve) => setImmediate(resolve));
    const slot = write[i]!;
    const path = join(paths.slots, slotFileName(slot.slot));
    knownGood.delete(path);
    // A file that was there (unreadable or revoked): atomicWriteSync refuses a symlink or a
    // non-regular file in its place, as before.
    atomicWriteSync(path, `${JSON.stringify(slot)}\n`, { mode: SLOT_FILE_MODE });
    remember(path, slot);
  }
  await fsyncDir(paths.slots);
  return result;
}

/** 0640: fetch (group agent-connectors-renew via the setgid hand-off dir) reads it. */
const SLOT_FILE_MODE = 0o640;

/**
 * `unbind` of the last binding of an instance: fetch stops renewing it. Also apply's
 * retirement of a slot's file, after the manifest no longer names it (reconcile.ts). The
 * manifest is not touched here: on a host without a desired state there is none (`bind`
 * writes per-slot files); on a managed one the desired state, not `unbind`, decides.
 */
export function retireSlot(paths: HandoffPaths, slot: string): Promise<boolean> {
  const path = join(paths.slots, slotFileName(slot));
  knownGood.delete(path);
  return deleteFile(path);
}
