import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { defaultTokenPath } from '../config/state-dir.js';
import { readInstances } from '../registry/registry-edit.js';
import { absolutePathSchema } from '../registry/schema.js';
import { parseSlotId } from './wire.js';

export interface TargetConfig {
  stateDir: string;
  instancesPath: string;
  providersPath: string;
}

// Only the field apply needs; the cli-proxy owns the full catalog schema.
const providersTokenFiles = z.record(z.string(), z.looseObject({ tokenFile: absolutePathSchema }));

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
  const text = await readFile(config.providersPath, 'utf8').catch(() => undefined);
  if (text !== undefined) {
    const catalog = providersTokenFiles.safeParse(JSON.parse(text) as unknown);
    if (!catalog.success) throw new Error('providers.json is invalid; not applying cli tokens until it is fixed');
    const entry = catalog.data[parsed.id];
    if (entry) return [entry.tokenFile];
  }
  return [join(config.stateDir, 'cli-proxy', `${parsed.id}.token`)];
}
