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
  // One index per registry content, not one scan of 10 000 bindings per token.
  const indexes = new WeakMap<InstancesFile, Map<string, string[]>>();
  const seen = new WeakMap<object, { instances?: InstancesFile; catalog?: Catalog }>();
  const indexOf = (instances: InstancesFile): Map<string, string[]> => {
    let index = indexes.get(instances);
    if (!index) indexes.set(instances, (index = tokenFilesByInstance(instances)));
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
