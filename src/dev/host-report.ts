import { existsSync } from 'node:fs';
import { basename } from 'node:path';
import { readAppliedState } from '../data/applied-state.js';
import { readCatalog } from '../data/catalog.js';
import { handoffPaths } from '../data/handoff.js';
import { readInstances } from '../data/registry.js';
import { watchDir } from '../fs/dir-watch.js';
import { runLoop } from '../service/loop.js';
import type { Service } from '../service/service.js';

/**
 * dev's narration of the host side: what apply has put in force, told in the user's terms
 * ("binding sandbox served at URL", "token file deleted"). It only reads what apply wrote
 * (applied-state.json, the registry, the catalog, token files), so what it says is what
 * the proxies serve. Level-triggered: each look compares the whole view with the last one,
 * so the order and number of file events do not matter.
 */

export interface HostView {
  version: number;
  rejected: number | null | undefined;
  /** Served = in the registry (catalog) with its token file present: id → token file. */
  bindings: Map<string, string>;
  providers: Map<string, string>;
  /** In the registry (catalog), served or not. */
  listedBindings: Map<string, string>;
  listedProviders: Map<string, string>;
}

export const EMPTY_VIEW: HostView = {
  version: 0,
  rejected: undefined,
  bindings: new Map(),
  providers: new Map(),
  listedBindings: new Map(),
  listedProviders: new Map(),
};

export interface HostReportConfig {
  handoffDir: string;
  instancesPath: string;
  providersPath: string;
  /** The demo name of a binding id (an unknown id is shown by a prefix only: ids are capabilities). */
  nameOf: (bindingId: string) => string | undefined;
  /** Where the proxies listen, once they do. */
  forwarderBase: () => string | undefined;
  cliProxyBase: () => string | undefined;
  say: (line: string) => void;
}

export async function readHostView(config: Pick<HostReportConfig, 'handoffDir' | 'instancesPath' | 'providersPath'>): Promise<HostView> {
  const applied = await readAppliedState(config.handoffDir);
  const instances = await readInstances(config.instancesPath).catch(() => ({}));
  const catalog = await readCatalog(config.providersPath).catch(() => ({}));
  const served = (entries: Array<[string, string]>): Map<string, string> => new Map(entries.filter(([, file]) => existsSync(file)));
  return {
    version: applied?.appliedAt ? applied.version : 0,
    rejected: applied?.rejected?.version,
    bindings: served(Object.entries(instances).map(([id, b]) => [id, b.tokenFile])),
    providers: served(Object.entries(catalog).map(([name, p]) => [name, p.tokenFile])),
    listedBindings: new Map(Object.entries(instances).map(([id, b]) => [id, b.tokenFile])),
    listedProviders: new Map(Object.entries(catalog).map(([name, p]) => [name, p.tokenFile])),
  };
}

/** The lines telling what changed from `prev` to `next`. Pure. */
export function describeChange(prev: HostView, next: HostView, config: Pick<HostReportConfig, 'nameOf' | 'forwarderBase' | 'cliProxyBase'>): string[] {
  const lines: string[] = [];
  if (next.version !== prev.version) lines.push(`host: desired state version ${next.version} applied`);
  if (next.rejected !== undefined && next.rejected !== prev.rejected) {
    lines.push(`host: desired state version ${next.rejected ?? '?'} rejected; the last good one keeps serving (see the log)`);
  }
  const label = (id: string): string => config.nameOf(id) ?? `${id.slice(0, 4)}…`;
  for (const [id] of next.bindings) {
    if (prev.bindings.has(id)) continue;
    const base = config.forwarderBase();
    lines.push(`host: binding ${label(id)} now served at ${base ? `${base}/i/${id}/mcp` : `/i/${id}/mcp`}`);
  }
  // A disconnect can come in two steps: the renewal's 404 deletes the token file at once,
  // the desired state then drops the entry. Both end as one disconnect.
  const gone = (served: Map<string, string>, listed: Map<string, string>, nextServed: Map<string, string>, nextListed: Map<string, string>): Array<[string, string]> => [
    ...[...served].filter(([key]) => !nextServed.has(key)),
    ...[...listed].filter(([key]) => !served.has(key) && !nextListed.has(key)),
  ];
  for (const [id, file] of gone(prev.bindings, prev.listedBindings, next.bindings, next.listedBindings)) {
    lines.push(
      next.listedBindings.has(id)
        ? `host: binding ${label(id)} has no token file now (${file}): the forwarder answers 503 until a renewal brings one`
        : `host: binding ${label(id)} disconnected: token file ${existsSync(file) ? 'still present' : 'deleted'} (${basename(file)}); its URL answers 404`,
    );
  }
  for (const [name] of next.providers) {
    if (prev.providers.has(name)) continue;
    const base = config.cliProxyBase();
    lines.push(`host: provider ${name} now served by the cli-proxy at ${base ? `${base}/p/${name}` : `/p/${name}`}`);
  }
  for (const [name, file] of gone(prev.providers, prev.listedProviders, next.providers, next.listedProviders)) {
    lines.push(
      next.listedProviders.has(name)
        ? `host: provider ${name} has no token file now (${basename(file)}): the cli-proxy answers 503 until a renewal brings one`
        : `host: provider ${name} disconnected: token file ${existsSync(file) ? 'still present' : 'deleted'} (${basename(file)}); /p/${name} answers 404`,
    );
  }
  return lines;
}

/**
 * apply's pass writes the registry first, deletes the token files after and
 * applied-state.json last (src/apply/reconcile.ts), and a look can fall in between: the
 * entry is gone with its file still there. While applied-state has not moved on, such an
 * entry still counts as served, so its disconnect is told once the pass is done, with the
 * file as the pass left it ("deleted", or really "still present"). Pure but for the stat.
 */
export function settled(prev: HostView, next: HostView): HostView {
  if (next.version !== prev.version) return next;
  const carry = (was: Map<string, string>, now: Map<string, string>, listed: Map<string, string>): Map<string, string> => {
    const out = new Map(now);
    for (const [key, file] of was) if (!now.has(key) && !listed.has(key) && existsSync(file)) out.set(key, file);
    return out;
  };
  return { ...next, bindings: carry(prev.bindings, next.bindings, next.listedBindings), providers: carry(prev.providers, next.providers, next.listedProviders) };
}

/** Watches the hand-off (applied-state.json, slot files: apply writes them after each token) and narrates. */
export function createHostReport(config: HostReportConfig): Service {
  return {
    name: 'dev-report',
    async run({ signal, log }) {
      let view = EMPTY_VIEW;
      const wakers = new Set<() => void>();
      const wakeAll = (): void => {
        for (const wake of wakers) wake();
      };
      const onError = (err: Error): void => log.warn({ err: { message: err.message } }, 'watching the hand-off failed; looking every few seconds');
      // applied-state.json in the hand-off's root, and slots/ (apply writes a slot file
      // after each token); not inbox/ or rejected/, which are fetch's and apply's traffic.
      const unwatch = [
        watchDir(config.handoffDir, wakeAll, onError, { reappear: true }),
        watchDir(handoffPaths(config.handoffDir).slots, wakeAll, onError, { reappear: true }),
      ];
      try {
        await runLoop({
          name: 'dev-report',
          log,
          signal,
          step: async () => {
            const next = settled(view, await readHostView(config));
            for (const line of describeChange(view, next, config)) config.say(line);
            view = next;
            return 5_000;
          },
          subscribeWake: (wake) => {
            wakers.add(wake);
            return () => wakers.delete(wake);
          },
        });
      } finally {
        for (const stop of unwatch) stop();
      }
    },
  };
}
