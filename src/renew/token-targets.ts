import { join } from 'node:path';
import { parseCatalog } from '../cli-proxy/catalog.js';
import { readConfigFile } from '../config/parse-json.js';
import { defaultTokenPath } from '../config/state-dir.js';
import { readInstances } from '../registry/registry-edit.js';
import { parseSlotId } from './wire.js';

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
    return files.size > 0 ? [...files] : [defaultTokenPath(config.stateDir, parsed.id)];
  }
  // The same catalog and parser as the cli-proxy: an invalid file throws a ConfigError that
  // names the file without quoting it, and apply leaves the inbox file for the next run.
  const catalog = await readConfigFile(config.providersPath, parseCatalog, {});
  if (Object.hasOwn(catalog, parsed.id)) return [(catalog[parsed.id] as { tokenFile: string }).tokenFile];
  return [join(config.stateDir, 'cli-proxy', `${parsed.id}.token`)];
}
