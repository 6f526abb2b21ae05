import { z } from 'zod';
import { isLoopbackHostname } from '../net/loopback-address.js';
import { parseJsonWith, type ParseResult } from '../data/parse.js';
import { bindingIdSchema } from '../data/registry.js';

/**
 * The formats of `agent-connectors dev`'s demo platform:
 *   - the demo Gateway's control surface (`/demo/...`): which demo connections exist and
 *     whether each is connected, as the platform's "connect a SaaS" page would show them;
 *   - `<state>/dev.json` (0600): what a running dev leaves for `dev connect|disconnect`
 *     (where its demo Gateway and proxies listen, its pid) and the demo binding ids it
 *     keeps across runs, so an agent configured once keeps working.
 */

export const demoKindSchema = z.enum(['binding', 'provider']);
export type DemoKind = z.infer<typeof demoKindSchema>;

/** Names of demo connections: short, lower case, safe in a URL path and an instance id. */
export const demoNameSchema = z.string().regex(/^[a-z][a-z0-9-]{0,31}$/, 'a demo connection name is [a-z][a-z0-9-]{0,31}');

export const demoConnectionSchema = z.strictObject({
  kind: demoKindSchema,
  name: demoNameSchema,
  connected: z.boolean(),
});
export type DemoConnection = z.infer<typeof demoConnectionSchema>;

/** The answer of every control request: the whole list and the desired state's version. */
export const demoControlAnswerSchema = z.strictObject({
  version: z.number().int().min(0),
  connections: z.array(demoConnectionSchema),
});
export type DemoControlAnswer = z.infer<typeof demoControlAnswerSchema>;

export const DEMO_CONTROL_PATH = '/demo';

const loopbackUrlSchema = z.url().refine((v) => {
  const u = new URL(v);
  return u.protocol === 'http:' && isLoopbackHostname(u.hostname);
}, 'must be an http:// URL on loopback');

export const devRuntimeSchema = z.strictObject({
  /** The dev process; `dev connect` refuses when it is gone rather than hang on a dead port. */
  pid: z.number().int().positive().nullable(),
  gateway: loopbackUrlSchema.nullable(),
  forwarder: loopbackUrlSchema.nullable(),
  cliProxy: loopbackUrlSchema.nullable(),
  /** Demo binding name → its binding id, kept across runs. */
  bindingIds: z.record(demoNameSchema, bindingIdSchema),
});
export type DevRuntime = z.infer<typeof devRuntimeSchema>;

export const DEV_RUNTIME_FILE = 'dev.json';

export function parseDevRuntime(text: string): ParseResult<DevRuntime> {
  return parseJsonWith(devRuntimeSchema, text);
}
