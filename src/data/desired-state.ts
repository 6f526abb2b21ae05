import { z } from 'zod';
import { commandSchema, duplicateCommand, providerNameSchema, providerPortProblem, providerSchema, type Catalog } from './catalog.js';
import { isLoopbackHostname } from '../net/loopback-address.js';
import { jsonTopLevelVersion } from './json-version.js';
import { checkWith, parseJsonText, sameJsonValue, type ParseResult } from './parse.js';
import { tlsCatalogProblem } from './tls-hosts.js';
import { bindingIdSchema, bindingSchema, type InstancesFile } from './registry.js';
import { cliSlot, instanceSlot } from './renew-wire.js';
import { tokenPath, type TokenLayout } from './token-path.js';

/**
 * The desired state of an enrolled host (SPEC §8): the whole set of bindings and providers
 * the platform wants here, versioned. One format for two places:
 *   - the 200 body of `GET {gw}/v1/host/state?after=<version>`;
 *   - the hand-off file `<handoff>/desired-state.json`, by which the link gives it to apply.
 *
 * It is the registry and the catalog without token paths: the Gateway never names a local
 * path, the host chooses them (`toLocalConfig`). Every field reuses the registry's and the
 * catalog's own schemas, so a state that validates here is one the forwarder and the
 * cli-proxy accept: https upstreams (http only to loopback), no connection headers as an
 * injection target, no `.`/`..` or `/` in a name that becomes a file name.
 *
 * Validation is of the whole: one bad entry rejects the state, and apply keeps the last
 * good one. Messages name the place (a binding id only by its prefix) and the rule, never
 * a value.
 *
 * Decision: entries are strict (an unknown field inside a binding or provider may change
 * what it means, e.g. a new injection rule; applying it half-understood would be wrong);
 * unknown top-level fields are dropped, so a Gateway can add a section old hosts ignore.
 */

/** Bounds. 10 000 bindings (0.9 MB) parse in 30-70 ms cold, ~110 ms under a loaded tap run (test/data/desired-state.test.ts). */
export const MAX_BINDINGS = 10_000;
export const MAX_PROVIDERS = 1_000;
export const MAX_COMMANDS_PER_PROVIDER = 64;
/** Largest state body or file, in bytes (10 000 bindings take about 1.5 MB). */
export const MAX_STATE_BYTES = 8 * 1024 * 1024;

/** Also not `.` or `..`: the id becomes a token file name (`<id>.token`) and a slot id. */
const instanceIdSchema = z
  .string()
  .regex(/^(?!\.{1,2}$)[A-Za-z0-9_.-]{1,128}$/, 'instanceId must match [A-Za-z0-9_.-]{1,128} and not be . or ..');

export const desiredBindingSchema = bindingSchema.omit({ tokenFile: true }).extend({ instanceId: instanceIdSchema });

export const desiredProviderSchema = providerSchema
  .omit({ tokenFile: true })
  .extend({ commands: z.array(commandSchema).max(MAX_COMMANDS_PER_PROVIDER, `at most ${MAX_COMMANDS_PER_PROVIDER} commands`).default([]) });

/**
 * JSON.parse makes `__proto__` an own key, and zod's record skips it silently: the state
 * would be accepted minus that entry. Refused instead, like any other bad entry.
 */
function boundedRecord<V extends z.ZodType>(key: z.ZodType<string>, value: V, max: number, what: string) {
  return z
    .unknown()
    .superRefine((v, ctx) => {
      if (typeof v !== 'object' || v === null || Array.isArray(v)) return;
      if (Object.hasOwn(v, '__proto__')) ctx.addIssue({ code: 'custom', message: `a ${what} key is __proto__` });
      if (Object.keys(v).length > max) ctx.addIssue({ code: 'custom', message: `more than ${max} ${what}s` });
    })
    .pipe(z.record(key, value));
}

export const desiredStateSchema = z
  .object({
    version: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
    bindings: boundedRecord(bindingIdSchema, desiredBindingSchema, MAX_BINDINGS, 'binding'),
    providers: boundedRecord(providerNameSchema, desiredProviderSchema, MAX_PROVIDERS, 'provider'),
  })
  .superRefine((s, ctx) => {
    // Shims are files named after commands: two providers cannot both own one.
    if (duplicateCommand(s.providers) !== undefined) {
      ctx.addIssue({ code: 'custom', path: ['providers'], message: 'a command name is declared by two providers' });
    }
    const tls = tlsCatalogProblem(s.providers);
    if (tls !== undefined) ctx.addIssue({ code: 'custom', path: ['providers'], message: tls });
    const port = providerPortProblem(s.providers);
    if (port !== undefined) ctx.addIssue({ code: 'custom', path: ['providers'], message: port });
  });

export type DesiredBinding = z.infer<typeof desiredBindingSchema>;
export type DesiredProvider = z.infer<typeof desiredProviderSchema>;
export type DesiredState = z.infer<typeof desiredStateSchema>;

/**
 * Issues under `bindings.<id>` show the id only by its prefix (a binding id is a
 * capability); a provider's name is no secret, and a rejection must say which provider.
 */
const KEY_DEPTHS = (path: readonly PropertyKey[], idx: number): boolean => idx === 1 && path[0] === 'bindings';

/** JSON text (a Gateway answer or the hand-off file) → a whole, valid state, or why not. */
export function parseDesiredState(text: string): ParseResult<DesiredState> {
  return parseDesiredStateAfter(text).result;
}

/** A state that validated, with the JSON it came from (what `parseDesiredStateAfter` compares against). */
export interface ValidatedState {
  value: DesiredState;
  json: { bindings: Record<string, unknown>; providers: Record<string, unknown> };
}

type JsonRecord = Record<string, unknown>;
const isRecord = (v: unknown): v is JsonRecord => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * `parseDesiredState`, given the last state that validated: an entry whose JSON is the same
 * as then (same id, same text) is not validated again, its value is reused. A state that
 * changes one binding of 10 000 validated all 10 000 again (zod: ~300 ms of apply's CPU on
 * this VM) before the disconnect could reach the forwarder. What changed is validated by
 * the same schema, as a state of its own (the same keys, so the same error paths); the
 * rules across providers run on the whole. Anything that fails, or that this shortcut
 * does not cover, takes the full parse, so the accepted states and the errors are the
 * full parse's. `validated` is what to pass next time.
 */
export function parseDesiredStateAfter(text: string, previous?: ValidatedState): { result: ParseResult<DesiredState>; validated?: ValidatedState } {
  if (Buffer.byteLength(text, 'utf8') > MAX_STATE_BYTES) return { result: { ok: false, error: `larger than ${MAX_STATE_BYTES} bytes` } };
  const json = parseJsonText(text);
  if (!json.ok) return { result: json };
  const value = (previous && unchangedReused(json.value, previous)) ?? checkWith(desiredStateSchema, json.value, KEY_DEPTHS);
  if (!value.ok || !isRecord(json.value)) return { result: value };
  return { result: value, validated: { value: value.value, json: { bindings: json.value.bindings as JsonRecord, providers: json.value.providers as JsonRecord } } };
}

/**
 * `Object.fromEntries(keys.map((k) => [k, value(k)]))` without a pair per key (10 000
 * bindings per state, twice). Every key an own property, as `fromEntries` makes it: a
 * `__proto__` key is defined, never assigned (which would set the prototype).
 */
function recordOf<V>(keys: readonly string[], value: (key: string) => V): Record<string, V> {
  const record: Record<string, V> = {};
  for (const key of keys) {
    if (key === '__proto__') Object.defineProperty(record, key, { value: value(key), enumerable: true, writable: true, configurable: true });
    else record[key] = value(key);
  }
  return record;
}

/** The state from what changed since `previous` plus `previous`'s values, or undefined for "take the full parse". */
function unchangedReused(json: unknown, previous: ValidatedState): ParseResult<DesiredState> | undefined {
  if (!isRecord(json) || !isRecord(json.bindings) || !isRecord(json.providers)) return undefined;
  const { bindings, providers } = json;
  const bindingIds = Object.keys(bindings);
  const providerNames = Object.keys(providers);
  if (bindingIds.length > MAX_BINDINGS || providerNames.length > MAX_PROVIDERS) return undefined;
  const same = (before: JsonRecord, now: JsonRecord, key: string): boolean => Object.hasOwn(before, key) && sameJsonValue(before[key], now[key]);
  // Object.fromEntries defines own properties: a `__proto__` key stays a key, which the schema refuses.
  const changedIds = bindingIds.filter((id) => !same(previous.json.bindings, bindings, id));
  const changedNames = providerNames.filter((name) => !same(previous.json.providers, providers, name));
  // Nothing to reuse (a first state, or a whole new one): the whole parse, without building a copy.
  if (changedIds.length === bindingIds.length && changedNames.length === providerNames.length) return undefined;
  const changed = {
    version: json.version,
    bindings: Object.fromEntries(changedIds.map((id) => [id, bindings[id]])),
    providers: Object.fromEntries(changedNames.map((name) => [name, providers[name]])),
  };
  const checked = desiredStateSchema.safeParse(changed);
  if (!checked.success) return undefined;
  const pick = <V>(fresh: Record<string, V>, old: Record<string, V>) => (key: string): [string, V] => [key, (Object.hasOwn(fresh, key) ? fresh[key] : old[key]) as V];
  const pickBinding = pick(checked.data.bindings, previous.value.bindings);
  const state: DesiredState = {
    version: checked.data.version,
    bindings: recordOf(bindingIds, (id) => pickBinding(id)[1]),
    providers: Object.fromEntries(providerNames.map(pick(checked.data.providers, previous.value.providers))),
  };
  // The rules across providers (desiredStateSchema's superRefine), on the whole.
  if (duplicateCommand(state.providers) !== undefined || tlsCatalogProblem(state.providers) !== undefined || providerPortProblem(state.providers) !== undefined) return undefined;
  return { ok: true, value: state };
}

/**
 * The version alone, from JSON text that may fail validation: what makes a state final for
 * its version even when apply rejects it (SPEC §8). null: not JSON, or no usable version.
 */
export function desiredStateVersion(text: string): number | null {
  // `JSON.parse(text)?.version` checked as before, without building the state (the link
  // reads the version of each 1.5 MB state it is answered): json-version.ts.
  return jsonTopLevelVersion(text) ?? null;
}

/** The state with nothing in it, the Gateway's answer for a host with no connection yet. */
export function emptyDesiredState(version = 0): DesiredState {
  return { version, bindings: {}, providers: {} };
}

/**
 * Per binding value (the parse reuses the value of an unchanged entry, and `toLocalConfig`
 * its registry entry): its slot id. A state that changes one binding of 10 000 built
 * 10 000 slot ids and token paths again, twice, in apply's plan (~100 ms of it at load).
 */
const slotByBinding = new WeakMap<object, string>();

function bindingSlot(b: { instanceId: string }): string {
  let slot = slotByBinding.get(b);
  if (slot === undefined) {
    slot = instanceSlot(b.instanceId);
    slotByBinding.set(b, slot);
  }
  return slot;
}

/** The renewal slots a state needs: one per AgentInstance, one per provider. */
export function slotsOf(state: Pick<DesiredState, 'bindings' | 'providers'>): Set<string> {
  const slots = new Set<string>();
  for (const b of Object.values(state.bindings)) slots.add(bindingSlot(b));
  for (const name of Object.keys(state.providers)) slots.add(cliSlot(name));
  return slots;
}

/** Per layout, per desired binding value: the registry entry `toLocalConfig` made of it (values are never mutated). */
const localBindings = new WeakMap<TokenLayout, WeakMap<DesiredBinding, InstancesFile[string]>>();

/**
 * The local files a state becomes: instances.json and providers.json, with token paths
 * chosen by the host (the layout's defaults, SPEC §2). Pure; the caller writes them.
 * Object.fromEntries defines own properties, so no key can reach a prototype.
 */
export function toLocalConfig(state: DesiredState, layout: TokenLayout): { instances: InstancesFile; catalog: Catalog } {
  let made = localBindings.get(layout);
  if (made === undefined) {
    made = new WeakMap();
    localBindings.set(layout, made);
  }
  const local = (b: DesiredBinding): InstancesFile[string] => {
    let entry = made.get(b);
    if (entry === undefined) {
      entry = { instanceId: b.instanceId, upstreamUrl: b.upstreamUrl, tokenFile: tokenPath({ kind: 'instance', id: b.instanceId }, layout) };
      made.set(b, entry);
    }
    return entry;
  };
  const instances: InstancesFile = recordOf(Object.keys(state.bindings), (id) => local(state.bindings[id]!));
  const catalog: Catalog = Object.fromEntries(
    Object.entries(state.providers).map(([name, p]) => [
      name,
      { ...p, tokenFile: tokenPath({ kind: 'cli', id: name }, layout) },
    ]),
  );
  return { instances, catalog };
}

/** The hand-off file's name inside `<handoff>/`. */
export const DESIRED_STATE_FILE = 'desired-state.json';

/**
 * Why a state aims an upstream at one of this host's own listeners (`ports`: both proxies'
 * and metrics ports), or undefined. A forwarder whose upstream is itself turned one request
 * into 15 000 sockets; the proxies refuse such a dispatch anyway, apply refuses the state
 * first so the operator sees it as a rejected state. Loopback upstreams as such stay
 * allowed (SPEC §5: tests, dev, a local service): the proxies check who listens there.
 */
/**
 * Per set of ports, per binding value: its answer (the port it hits, or null). The parse
 * reuses the value of an unchanged binding (`parseDesiredStateAfter`), so a state that
 * changes one binding of 10 000 checks one upstream, not 10 000 (a regex replace and a
 * search per port each: ~10 % of apply's CPU in the renewal burst, 25 disconnects).
 * Values are never mutated, and the answer depends on the value and the ports alone.
 */
let hitsMemo: { key: string; answers: WeakMap<object, number | null> } | undefined;

export function ownListenerUpstream(state: DesiredState, ports: readonly number[]): string | undefined {
  // The port a URL names is in its text in decimal (leading zeros at most), once the tabs
  // and line breaks the URL parser drops are gone: a text naming none of `ports`, with no
  // default port among them, needs no URL parse (10 000 of them cost ~150 ms per state).
  const defaults = ports.includes(443) || ports.includes(80);
  const hits = (value: string): number | undefined => {
    const text = value.replace(/[\t\n\r]/g, '');
    if (!defaults && !ports.some((p) => text.includes(String(p)))) return undefined;
    const url = new URL(value);
    const port = url.port === '' ? (url.protocol === 'https:' ? 443 : 80) : Number(url.port);
    return isLoopbackHostname(url.hostname.replace(/^\[|\]$/g, '')) && ports.includes(port) ? port : undefined;
  };
  const key = ports.join(',');
  if (hitsMemo?.key !== key) hitsMemo = { key, answers: new WeakMap() };
  const { answers } = hitsMemo;
  for (const b of Object.values(state.bindings)) {
    let port = answers.get(b);
    if (port === undefined) answers.set(b, (port = hits(b.upstreamUrl) ?? null));
    if (port !== null) return `a binding's upstreamUrl is this host's own listener (port ${port})`;
  }
  for (const p of Object.values(state.providers)) {
    // A TLS-mode provider has hosts, never loopback ones (data/tls-hosts.ts), and no upstream.
    if (p.upstream === undefined) continue;
    const port = hits(p.upstream);
    if (port !== undefined) return `a provider's upstream is this host's own listener (port ${port})`;
  }
  return undefined;
}
