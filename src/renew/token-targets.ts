import { readCatalog } from '../data/catalog.js';
import { readInstances } from '../data/registry.js';
import { stateLayout } from '../data/state-layout.js';
import { parseSlotId } from '../data/renew-wire.js';

export interface TargetConfig {
  stateDir: string;
  instancesPath: string;
  providersPath: string;
}

/**
 * The token file(s) a slot's token goes to: for `instance:<id>`, every distinct tokenFile
 * the registry names for that instance (else the §2 default); for `cli:<provider>`, the
 * catalog's tokenFile (else `<state>/cli-proxy/<provider>.token`).
 */
export async function tokenFilesFor(slot: string, config: TargetConfig): Promise<string[]> {
  const parsed = parseSlotId(slot);
  if (!parsed) throw new Error(`invalid slot id`);
  if (parsed.kind === 'instance') {
    const all = await readInstances(config.instancesPath);
    const files = new Set(Object.values(all).filter((b) => b.instanceId === parsed.id).map((b) => b.tokenFile));
    return files.size > 0 ? [...files] : [stateLayout(config.stateDir).instanceToken(parsed.id)];
  }
  // The same catalog and parser as the cli-proxy: an invalid file throws a ConfigError that
  // names the file without quoting it, and apply leaves the inbox file for the next run.
  const catalog = await readCatalog(config.providersPath);
  if (Object.hasOwn(catalog, parsed.id)) return [(catalog[parsed.id] as { tokenFile: string }).tokenFile];
  return [stateLayout(config.stateDir).providerToken(parsed.id)];
}
