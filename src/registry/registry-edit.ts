import { mkdir, readFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { ConfigError } from '../errors.js';
import { atomicWrite, ownerFor } from '../fs/atomic-write.js';
import { withFileLock } from '../fs/file-lock.js';
import { instancesFileSchema, parseInstancesFile, describeIssues, type InstancesFile } from './schema.js';

export async function readInstances(path: string): Promise<InstancesFile> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw err;
  }
  const parsed = parseInstancesFile(text);
  if (!parsed.ok) throw new ConfigError(`${path} is invalid (${parsed.error}); fix or remove it first`);
  return parsed.value;
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
