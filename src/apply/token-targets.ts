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
 */
export function tokenTargets(files: LocalConfigFiles, layout: TokenLayout): (slot: string) => Promise<string[]> {
  // One index per registry content, not one scan of 10 000 bindings per token.
  const indexes = new WeakMap<InstancesFile, Map<string, string[]>>();
  return async (slot) => {
    const owner = parseSlotId(slot);
    if (!owner) throw new Error(`invalid slot id`);
    if (owner.kind === 'instance') {
      const instances = await files.instances.get();
      let index = indexes.get(instances);
      if (!index) indexes.set(instances, (index = tokenFilesByInstance(instances)));
      return index.get(owner.id) ?? [tokenPath(owner, layout)];
    }
    const catalog = await files.catalog.get();
    return [tokenPath(owner, layout, Object.hasOwn(catalog, owner.id) ? catalog[owner.id]?.tokenFile : undefined)];
  };
}
