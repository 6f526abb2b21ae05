import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import { z } from 'zod';
import { ConfigError } from '../errors.js';
import { atomicWrite, ownerFor } from '../fs/atomic-write.js';
import { withFileLock } from '../fs/file-lock.js';
import { absolutePathSchema, upstreamUrlSchema } from './fields.js';
import { checkWith, describeIssues, keyPrefix, parseJsonText, readConfigFile, recordReusing, type ParseResult } from './parse.js';

/** The binding registry, `<state>/mcp-forwarder/instances.json` (SPEC §3). */

export const BINDING_ID = /^[A-Za-z0-9_-]{8,128}$/;

export const bindingIdSchema = z.string().regex(BINDING_ID, 'bindingId must match [A-Za-z0-9_-]{8,128}');

export const bindingSchema = z.strictObject({
  instanceId: z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/, 'instanceId must match [A-Za-z0-9_.-]{1,128}'),
  upstreamUrl: upstreamUrlSchema,
  tokenFile: absolutePathSchema,
});

export const instancesFileSchema = z.record(bindingIdSchema, bindingSchema);

export type Binding = z.infer<typeof bindingSchema>;
export type InstancesFile = z.infer<typeof instancesFileSchema>;

/** A short, non-secret prefix of a binding id, safe for logs. */
export const bindingPrefix = keyPrefix;

/** `previous`: the last good registry read (the forwarder's reload): its unchanged entries are not validated again. */
export function parseInstancesFile(text: string, previous?: InstancesFile): ParseResult<InstancesFile> {
  const json = parseJsonText(text);
  if (!json.ok) return json;
  return (previous && recordReusing(instancesFileSchema, json.value, previous)) ?? checkWith(instancesFileSchema, json.value);
}

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
