import type { SlotKind } from './renew-wire.js';
import type { StateLayout } from './state-layout.js';

/** The layout's default token files (SPEC §2). */
export type TokenLayout = Pick<StateLayout, 'instanceToken' | 'providerToken'>;

/** Whose token: an AgentInstance (all its bindings share it) or a cli-proxy provider. */
export interface TokenOwner {
  kind: SlotKind;
  id: string;
}

/**
 * The token file of an AgentInstance or a provider: the one its registry or catalog entry
 * names, else the layout's default (SPEC §2). The only place that choice is made: `bind`,
 * a desired state's local config, apply's token targets and reconcile's clean-up all ask
 * here, so a token is never written to one path and looked for at another.
 */
export function tokenPath(owner: TokenOwner, layout: TokenLayout, named?: string): string {
  if (named !== undefined) return named;
  return owner.kind === 'instance' ? layout.instanceToken(owner.id) : layout.providerToken(owner.id);
}
