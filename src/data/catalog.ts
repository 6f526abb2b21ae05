import { z } from 'zod';
import { COMMAND_NAME, COMMAND_NAME_RULE, envNameProblem, LINE_BREAK_OR_NUL, NO_LINE_BREAK_RULE } from './catalog-rules.js';
import { absolutePathSchema, upstreamUrlSchema } from './fields.js';
import { hostsSchema, placeholderSchema, tlsCatalogProblem } from './tls-hosts.js';
import { checkWith, parseJsonText, readConfigFile, recordReusing, type ParseResult } from './parse.js';

/**
 * The provider catalog, `<state>/cli-proxy/providers.json` (SPEC §5): where each SaaS's
 * token may go and which CLIs use it. Read by the cli-proxy, renewal, shims and doctor.
 */

/** `.` and `..` match the alphabet but name no file and no route segment: refused. */
export const PROVIDER_NAME = /^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,64}$/;
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$/;

/** Headers that are never an injection target: they belong to the connection, not the API. */
const RESERVED_HEADERS = new Set(['host', 'connection', 'content-length', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'keep-alive']);

/** A value that reaches a header, a URL or a shim line: one line, no NUL (catalog-rules.ts). */
const oneLine = (max: number) => z.string().max(max).refine((v) => !LINE_BREAK_OR_NUL.test(v), NO_LINE_BREAK_RULE);

const tokenTemplate = oneLine(256).refine((v) => v.includes('{token}'), 'must contain {token}');

export const injectSchema = z.discriminatedUnion('type', [
  z.strictObject({
    type: z.literal('header'),
    name: z
      .string()
      .regex(HEADER_NAME, 'not a valid header name')
      .refine((n) => !RESERVED_HEADERS.has(n.toLowerCase()), 'cannot inject into a connection header'),
    value: tokenTemplate,
  }),
  z.strictObject({ type: z.literal('query'), name: z.string().min(1).max(64).regex(/^[A-Za-z0-9_.~-]+$/, 'not a plain query parameter name') }),
  /** HTTP Basic: `username:password`, either of which may be the {token} template. */
  z.strictObject({ type: z.literal('basic'), username: oneLine(256).default(''), password: oneLine(256).default('{token}') }).refine(
    (b) => b.username.includes('{token}') || b.password.includes('{token}'),
    'basic injection needs {token} in username or password',
  ),
  /** AWS SigV4 (SPEC §10): the token file holds the key as JSON; the proxy signs each request again. */
  z.strictObject({ type: z.literal('aws-sigv4') }),
]);

/** The allow rule and its deny list (catalog-rules.ts); the message names the rule, and the name only once it is known to be plain. */
const envNameSchema = z.string().superRefine((name, ctx) => {
  const problem = envNameProblem(name);
  if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem });
});

/** Enough for `--api-base <url> --api-key <placeholder>` and a few flags; a catalog is not a script. */
export const MAX_ARGS = 16;
export const MAX_ARG_LENGTH = 1024;

/**
 * The name's syntax is checked here, by every reader; whether it names one of the host's
 * own tools needs the operator's allow file, so apply and `shims install` check that
 * (`hostToolProblem`).
 */
export const commandSchema = z.strictObject({
  name: z.string().regex(COMMAND_NAME, COMMAND_NAME_RULE),
  env: z.record(envNameSchema, oneLine(4096)).default({}),
  /** Put before the agent's own arguments (SPEC §10): the value rules of env values, and a bound on count and length. */
  args: z.array(oneLine(MAX_ARG_LENGTH)).max(MAX_ARGS, `at most ${MAX_ARGS} args`).optional(),
});

/**
 * Provider ports (SPEC §10): a CLI that drops the base URL's path gets a listener of its
 * own, `127.0.0.1:<port>`, where every request is the provider's `/p/<provider>/…`. The
 * catalog names the port, inside a documented range, so the shims and the cli-proxy
 * (separate processes) agree on it without any shared state.
 */
export const PROVIDER_PORT_MIN = 18300;
export const PROVIDER_PORT_MAX = 18399;
export const providerPortSchema = z
  .number()
  .int()
  .min(PROVIDER_PORT_MIN, `port must be in ${PROVIDER_PORT_MIN}-${PROVIDER_PORT_MAX}`)
  .max(PROVIDER_PORT_MAX, `port must be in ${PROVIDER_PORT_MIN}-${PROVIDER_PORT_MAX}`);

/**
 * `mode` (SPEC §10): `base-url` (the default) serves `/p/<provider>/` and needs `upstream`; `tls` is
 * reached through CONNECT to one of its `hosts` and has no `upstream`. Which fields go
 * with which mode is checked over the whole catalog (`tlsCatalogProblem`), so that this
 * stays a plain object the desired state can `omit` from.
 */
export const providerSchema = z.strictObject({
  mode: z.enum(['base-url', 'tls']).optional(),
  upstream: upstreamUrlSchema.optional(),
  hosts: hostsSchema.optional(),
  tokenFile: absolutePathSchema,
  inject: injectSchema,
  placeholder: placeholderSchema.optional(),
  /** A base-url provider's own port (providerPortSchema); a tls provider has none. */
  port: providerPortSchema.optional(),
  commands: z.array(commandSchema).default([]),
});

export const providerNameSchema = z.string().regex(PROVIDER_NAME, 'provider name must match [A-Za-z0-9_.-]{1,64} and not be . or ..');

export const catalogSchema = z.record(providerNameSchema, providerSchema);

export type Inject = z.infer<typeof injectSchema>;
export type Provider = z.infer<typeof providerSchema>;
export type Catalog = z.infer<typeof catalogSchema>;

/** `previous`: the last good catalog read (the cli-proxy's reload): its unchanged entries are not validated again. */
export function parseCatalog(text: string, previous?: Catalog): ParseResult<Catalog> {
  const json = parseJsonText(text);
  if (!json.ok) return json;
  // Provider names are no secret (they are in every /p/<provider>/ URL): shown whole.
  const parsed = (previous && recordReusing(catalogSchema, json.value, previous)) ?? checkWith(catalogSchema, json.value, []);
  if (!parsed.ok) return parsed;
  const dup = duplicateCommand(parsed.value);
  if (dup !== undefined) return { ok: false, error: `schema: command "${dup}" is declared by two providers` };
  const tls = tlsCatalogProblem(parsed.value);
  if (tls !== undefined) return { ok: false, error: `schema: ${tls}` };
  const port = providerPortProblem(parsed.value);
  if (port !== undefined) return { ok: false, error: `schema: ${port}` };
  return parsed;
}

/** A port named by two providers, or by a tls provider (which is reached through CONNECT only), or undefined. */
export function providerPortProblem(providers: Record<string, { mode?: string | undefined; port?: number | undefined }>): string | undefined {
  const seen = new Map<number, string>();
  for (const [name, p] of Object.entries(providers)) {
    if (p.port === undefined) continue;
    if (p.mode === 'tls') return `providers.${name}.port: a tls provider has no port (it is reached through CONNECT)`;
    const other = seen.get(p.port);
    if (other !== undefined) return `port ${p.port} is named by two providers (${other}, ${name})`;
    seen.set(p.port, name);
  }
  return undefined;
}

/** port → provider, for the cli-proxy's provider listeners and the shims' {baseUrl}. */
export function providerPorts(providers: Record<string, { port?: number | undefined }>): Map<number, string> {
  const out = new Map<number, string>();
  for (const [name, p] of Object.entries(providers)) if (p.port !== undefined) out.set(p.port, name);
  return out;
}

/**
 * A command name declared by more than one provider (two shims cannot share one file
 * name), or undefined. Shared with the desired state, which checks the same rule.
 */
export function duplicateCommand(providers: Record<string, { commands: ReadonlyArray<{ name: string }> }>): string | undefined {
  const seen = new Set<string>();
  for (const p of Object.values(providers)) {
    for (const c of p.commands) {
      if (seen.has(c.name)) return c.name;
      seen.add(c.name);
    }
  }
  return undefined;
}

/** For one-shot readers (shims install, token targets): missing → empty; invalid → ConfigError. */
export function readCatalog(path: string): Promise<Catalog> {
  return readConfigFile(path, parseCatalog, {});
}
