import { unlink } from 'node:fs/promises';

/** Deletes a file; gone already is fine. Whether it was there. */
export async function deleteFile(path: string): Promise<boolean> {
  try {
    await unlink(path);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}
