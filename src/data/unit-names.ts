/**
 * The systemd units of units/ by name, once (the files on disk carry the same names; the
 * systemd tests check both agree). Doctor, status, enroll and install name units only
 * through these.
 */

export const TARGET_UNIT = 'agent-connectors.target';
export const FORWARDER_UNIT = 'agent-connectors-forwarder.service';
export const CLI_PROXY_UNIT = 'agent-connectors-cli-proxy.service';
/** The link holds the host credential: renewal, desired-state poll, presence, audit upload. */
export const LINK_UNIT = 'agent-connectors-link.service';
/** The only writer; keeps its 0.1.0 name this release (docs/packaging.md). */
export const APPLY_UNIT = 'agent-connectors-renew-apply.service';

/** Every service the target wants, in the order doctor reports them. */
export const SERVICE_UNITS = [FORWARDER_UNIT, CLI_PROXY_UNIT, LINK_UNIT, APPLY_UNIT] as const;

/** A unit's name without `.service`, as `journalctl -u` and messages print it. */
export function unitStem(unit: string): string {
  return unit.replace(/\.service$/, '');
}

/** DynamicUser=yes names the link's user, and its StateDirectory=, after the unit. */
export const LINK_USER = unitStem(LINK_UNIT);

/**
 * 0.1.0's name for the link's unit (and so for its DynamicUser and state directory): an
 * upgrade moves its enablement, state and env file to the link's (src/install/link-rename.ts).
 */
export const OLD_LINK_UNIT = 'agent-connectors-renew-fetch.service';
