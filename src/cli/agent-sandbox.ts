import type { AgentName } from './mcp-add.js';

/**
 * Codex's `-c` overrides that let the commands it runs reach the loopback cli-proxy.
 * Its default sandbox turns the network off; either override alone leaves it off
 * (measured with Codex 0.171.0's `codex sandbox`). Its permission profiles' domain
 * allow-list is not offered instead: it is enforced by Codex's own proxy, which a CLI
 * that never proxies loopback (Go's net/http) and a TLS-mode shim (which names the
 * cli-proxy as its HTTPS proxy) connect around, and direct connections are refused.
 */
export const CODEX_SANDBOX_OVERRIDES = ['sandbox_mode="workspace-write"', 'sandbox_workspace_write.network_access=true'] as const;

/** The overrides as shell words, single-quoted so the TOML strings' quotes survive the shell. */
export function codexOverrideWords(): string {
  return CODEX_SANDBOX_OVERRIDES.map((o) => `-c '${o}'`).join(' ');
}

/**
 * What the agent's own sandbox means for the shims, as shell comments (the output of
 * `shims path` stays runnable). Each line says what the user must set, or why nothing
 * set on the agent's side can help.
 */
export function sandboxNote(agent: AgentName): string[] {
  switch (agent) {
    case 'codex':
      return [
        '# Codex runs commands in a sandbox with the network off, so a shim cannot reach the cli-proxy (127.0.0.1:14324);',
        `# the ${CODEX_SANDBOX_OVERRIDES.length} -c flags above let it (in ~/.codex/config.toml: sandbox_mode = "workspace-write" and, under [sandbox_workspace_write], network_access = true).`,
        '# They open the whole network to those commands: Codex cannot admit the cli-proxy alone (its domain allow-list works through its own proxy, which Go CLIs and TLS-mode shims do not use).',
      ];
    case 'claude':
      return [
        '# Claude Code\'s sandbox is off by default. Turned on (sandbox.enabled), it lets commands out only through its own proxy,',
        '# which Go CLIs and TLS-mode shims do not use: keep it off for this user, or list the shimmed commands in sandbox.excludedCommands.',
      ];
    case 'openclaw':
      return [
        '# OpenClaw\'s sandbox (agents.defaults.sandbox.mode, off by default) runs commands in a container with no network whose 127.0.0.1 is not the host\'s:',
        '# the shims serve commands OpenClaw runs on the host only.',
      ];
  }
}
