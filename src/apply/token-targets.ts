import { stat } from 'node:fs/promises';
import { readCatalog, type Catalog } from '../data/catalog.js';
import { readInstances, type InstancesFile } from '../data/registry.js';
import { stateLayout } from '../data/state-layout.js';
import { parseSlotId } from '../data/renew-wire.js';

export interface TargetConfig {
  stateDir: string;
  instancesPath: string;
  providersPath: string;
}

/**
 * The last parse of a file, reused while the file is the same one (inode, size, mtime):
 * apply asks for every token it writes, and with 10 000 bindings a parse of the registry
 * per token made applying them quadratic. Atomic writes replace the inode, so a change is
 * never missed.
 */
function memoByStat<T>(read: (path: string) => Promise<T>): (path: string) => Promise<T> {
  let last: { path: string; key: string; value: T } | undefined;
  return async (path) => {
    const st = await stat(path).catch(() => undefined);
    const key = st ? `${st.ino}:${st.size}:${st.mtimeMs}` : 'missing';
    if (last && last.path === path && last.key === key) return last.value;
    const value = await read(path);
    last = { path, key, value };
    return value;
  };
}

const readInstancesMemo = memoByStat<InstancesFile>(readInstances);
const readCatalogMemo = memoByStat<Catalog>(readCatalog);

/**
 * The token file(s) a slot's token goes to: for `instance:<id>`, every distinct tokenFile
 * the registry names for that instance (else the §2 default); for `cli:<provider>`, the
 * catalog's tokenFile (else `<state>/cli-proxy/<provider>.token`).
 */
export async function tokenFilesFor(slot: string, config: TargetConfig): Promise<string[]> {
  const parsed = parseSlotId(slot);
  if (!parsed) throw new Error(`invalid slot id`);
  if (parsed.kind === 'instance') {
    const all = await readInstancesMemo(config.instancesPath);
    const files = new Set(Object.values(all).filter((b) => b.instanceId === parsed.id).map((b) => b.tokenFile));
    return files.size > 0 ? [...files] : [stateLayout(config.stateDir).instanceToken(parsed.id)];
  }
  // The same catalog and parser as the cli-proxy: an invalid file throws a ConfigError that
  // names the file without quoting it, and apply leaves the inbox file for the next run.
  const catalog = await readCatalogMemo(config.providersPath);
  if (Object.hasOwn(catalog, parsed.id)) return [(catalog[parsed.id] as { tokenFile: string }).tokenFile];
  return [stateLayout(config.stateDir).providerToken(parsed.id)];
}

/** Where apply writes token files unless a binding or the catalog names another path. */
export function defaultTokenDirs(stateDir: string): string[] {
  const layout = stateLayout(stateDir);
  return [layout.forwarderDir, layout.cliProxyDir];
}
