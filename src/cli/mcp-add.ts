export const AGENTS = ['claude', 'codex', 'openclaw'] as const;
export type AgentName = (typeof AGENTS)[number];

export function mcpUrl(base: string, bindingId: string): string {
  return `${base.replace(/\/+$/, '')}/i/${bindingId}/mcp`;
}

/** The agent's own official one-line command for adding a Streamable HTTP MCP server. */
export function mcpAddCommand(agent: AgentName, name: string, url: string): string {
  switch (agent) {
    case 'claude':
      return `claude mcp add --transport http ${name} ${url}`;
    case 'codex':
      return `codex mcp add ${name} --url ${url}`;
    case 'openclaw':
      return `openclaw mcp add ${name} --url ${url} --transport streamable-http`;
  }
}
