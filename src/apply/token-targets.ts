import type { Catalog } from '../data/catalog.js';
import type { InstancesFile } from '../data/registry.js';
import { parseSlotId } from '../data/renew-wire.js';
import { tokenPath, type TokenLayout } from '../data/token-path.js';
import type { LocalConfigFiles } from './local-config.js';

/** instanceId → the distinct token files its bindings name. */
function tokenFilesByInstance(instances: InstancesFile): Map<string, string[]> {
  const sets = new Map<string, Set<string>>();
  for (const b of Object.values(instances)) {
    const files = sets.get(b.instanceId) ?? new Set<string>();
    files.add(b.tokenFile);
    sets.set(b.instanceId, files);
  }
  return new Map([...sets].map(([id, files]) => [id, [...files]]));
}

type Binding = InstancesFile[string];

/**
 * The index of the registry apply last indexed, kept so that the next one follows from it
 * plus what changed: a new state makes a new registry object, but `toLocalConfig` reuses
 * the entry object of every unchanged binding, so comparing entries by identity finds the
 * few that changed. Building the index whole (a Set per instance, 10 000 bindings) for
 * each new state was ~4 % of apply's CPU in the renewal burst (one state per disconnect).
 * `counts` is the last registry's instanceId → tokenFile → bindings naming it.
 */
interface Indexed {
  instances: InstancesFile;
  index: Map<string, string[]>;
  counts: Map<string, Map<string, number>>;
}

function countsOf(instances: InstancesFile): Map<string, Map<string, number>> {
  const counts = new Map<string, Map<string, number>>();
  for (const b of Object.values(instances)) count(counts, b, 1);
  return counts;
}

function count(counts: Map<string, Map<string, number>>, b: Binding, delta: 1 | -1): void {
  let files = counts.get(b.instanceId);
  if (!files) counts.set(b.instanceId, (files = new Map()));
  const n = (files.get(b.tokenFile) ?? 0) + delta;
  if (n > 0) files.set(b.tokenFile, n);
  else files.delete(b.tokenFile);
  if (files.size === 0) counts.delete(b.instanceId);
}

/** `next`'s index from `last`'s (whose counts it takes over) and the entries that differ. */
function followIndex(last: Indexed, next: InstancesFile): Indexed {
  const { instances: prev, counts } = last;
  const touched = new Set<string>();
  const change = (b: Binding, delta: 1 | -1): void => {
    count(counts, b, delta);
    touched.add(b.instanceId);
  };
  for (const id of Object.keys(prev)) if (!Object.hasOwn(next, id)) change(prev[id]!, -1);
  for (const id of Object.keys(next)) {
    const b = next[id]!;
    const old = Object.hasOwn(prev, id) ? prev[id] : undefined;
    if (old === b) continue;
    if (old) change(old, -1);
    change(b, 1);
  }
  const index = new Map(last.index);
  for (const id of touched) {
    const files = counts.get(id);
    if (files) index.set(id, [...files.keys()]);
    else index.delete(id);
  }
  return { instances: next, index, counts };
}

/**
 * Where a slot's token goes: for `instance:<id>`, every distinct tokenFile the registry
 * names for that instance; for `cli:<provider>`, the catalog's tokenFile; else the
 * layout's default. From the registry and catalog apply holds (see RememberedFile), so a
 * token does not re-read what reconcile has just written. An invalid file throws a
 * ConfigError that names it without quoting it: apply leaves the inbox file for the next run.
 *
 * With `round`, the registry and the catalog are looked at (a stat each) once per round of
 * the inbox, not once per token: an instance the round's registry does not know is looked
 * up again at once (`bind` writes the registry before the slot, the slot before fetch
 * hands over a token), so only a binding whose tokenFile an operator changed during the
 * round keeps the old path for that round's token, as it did when the stat came just
 * before the change.
 */
export function tokenTargets(files: LocalConfigFiles, layout: TokenLayout): (slot: string, round?: object) => Promise<string[]> {
  // One index per registry content, not one scan of 10 000 bindings per token; a new
  // registry's from the last one's (`followIndex`) when it is the one apply indexed last.
  const indexes = new WeakMap<InstancesFile, Map<string, string[]>>();
  const seen = new WeakMap<object, { instances?: InstancesFile; catalog?: Catalog }>();
  let last: Indexed | undefined;
  const indexOf = (instances: InstancesFile): Map<string, string[]> => {
    let index = indexes.get(instances);
    if (index) return index;
    // Any registry follows from the last one indexed (the diff says what differs, in
    // either direction): a round that still holds an older registry gets its index too.
    if (last) {
      last = followIndex(last, instances);
      index = last.index;
    } else {
      index = tokenFilesByInstance(instances);
      last = { instances, index, counts: countsOf(instances) };
    }
    indexes.set(instances, index);
    return index;
  };
  return async (slot, round) => {
    const owner = parseSlotId(slot);
    if (!owner) throw new Error(`invalid slot id`);
    let kept = round && seen.get(round);
    if (round && !kept) seen.set(round, (kept = {}));
    if (owner.kind === 'instance') {
      const known = kept?.instances && indexOf(kept.instances).get(owner.id);
      if (known) return known;
      const instances = await files.instances.get();
      if (kept) kept.instances = instances;
      return indexOf(instances).get(owner.id) ?? [tokenPath(owner, layout)];
    }
    const catalog = kept?.catalog && Object.hasOwn(kept.catalog, owner.id) ? kept.catalog : await files.catalog.get();
    if (kept) kept.catalog = catalog;
    return [tokenPath(owner, layout, Object.hasOwn(catalog, owner.id) ? catalog[owner.id]?.tokenFile : undefined)];
  };
}
