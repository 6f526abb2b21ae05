import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import { readConfigFile } from '../config/parse-json.js';
import { ConfigError } from '../errors.js';
import { atomicWrite, ownerFor } from '../fs/atomic-write.js';
import { withFileLock } from '../fs/file-lock.js';
import { instancesFileSchema, parseInstancesFile, describeIssues, type InstancesFile } from './schema.js';

export function readInstances(path: string): Promise<InstancesFile> {
  return readConfigFile(path, parseInstancesFile, {});
}

/**
 * Read-modify-write of instances.json under its lock, written atomically (0600), so two
 * concurrent binds both survive and the forwarder never sees half a file. An invalid file
 * is never overwritten: the operator's hand edit would be lost.
 */
export async function updateInstances<T>(path: string, change: (current: InstancesFile) => { next: InstancesFile; result: T }): Promise<T> {
  const dir = dirname(path);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const owner = await ownerFor(dir);
  return withFileLock(path, async () => {
    const current = await readInstances(path);
    const { next, result } = change(current);
    const checked = instancesFileSchema.safeParse(next);
    if (!checked.success) throw new ConfigError(describeIssues(checked.error));
    await atomicWrite(path, `${JSON.stringify(checked.data, null, 2)}\n`, { mode: 0o600, owner });
    return result;
  });
}
