import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { HotFile } from '../config/hot-file.js';
import { parseAgentUsers, type AgentUserEntry } from '../data/agent-users.js';
import type { ParseResult } from '../data/parse.js';
import type { Logger } from '../log/logger.js';

/** user name → UID from a passwd-format file (names resolve here, not through NSS: the units see /etc/passwd). */
export function passwdUids(passwd = '/etc/passwd'): Map<string, number> {
  const users = new Map<string, number>();
  for (const line of readFileSync(passwd, 'utf8').split('\n')) {
    const [name, , uid] = line.split(':');
    if (name && uid && /^\d+$/.test(uid)) users.set(name, Number(uid));
  }
  return users;
}

/** Entries → UIDs; a name that does not resolve is an error naming it (a typo must not pass silently). */
export function resolveAgentUsers(entries: readonly AgentUserEntry[], passwd?: string): ParseResult<number[]> {
  let users: Map<string, number> | undefined;
  const uids: number[] = [];
  for (const e of entries) {
    if ('uid' in e) {
      uids.push(e.uid);
      continue;
    }
    users ??= passwdUids(passwd);
    const uid = users.get(e.name);
    if (uid === undefined) return { ok: false, error: `no such user "${e.name}"` };
    uids.push(uid);
  }
  return { ok: true, value: uids };
}

/** systemd's range for DynamicUser= UIDs (systemd's UIDS-GIDS.md): assigned at each start, found only through NSS. */
const DYNAMIC_UID_MIN = 61184;
const DYNAMIC_UID_MAX = 65519;

/** The user name of a UID through NSS (nss-systemd knows dynamic users); undefined if none. */
export function nssUserName(uid: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    execFile('getent', ['passwd', String(uid)], { env: {}, timeout: 2_000, maxBuffer: 4096 }, (err, stdout) => {
      resolve(err ? undefined : stdout.split(':')[0] || undefined);
    });
  });
}

export interface PeerAccessOptions {
  /** UIDs always served, whatever the file says (root, the service's own user). */
  always: ReadonlySet<number>;
  /**
   * DynamicUser= names always served (the link, which reads both proxies' /healthz for
   * its presence report). Their UIDs change between starts, so a refused UID in systemd's
   * dynamic range is looked up by name: a cost paid only on that refusal path.
   */
  alwaysDynamic?: readonly string[];
  /** UID → name through NSS (a parameter for tests). */
  userName?: (uid: number) => Promise<string | undefined>;
  /** Fixed extra UIDs (`--allowed-uids`). */
  fixed?: ReadonlySet<number> | undefined;
  /** The agent-users file, watched and re-read on reload. */
  file?: string | undefined;
  passwd?: string;
  log: Logger;
}

/**
 * Who may use a proxy: the always-allowed, `--allowed-uids` and the agent-users file's
 * users. The file is resolved at start, on every change and on SIGHUP; a missing or empty
 * file serves only the always-allowed (fail closed) and says so once per load; an invalid
 * one (bad line, unknown user) keeps the last good list.
 */
export class PeerAccess {
  private readonly file: HotFile<number[]> | undefined;

  constructor(private readonly options: PeerAccessOptions) {
    const path = options.file;
    if (!path) return;
    const fix = `add the agent's user name to ${path} (sudo agent-connectors install --agent-user NAME, or by hand; one per line)`;
    this.file = new HotFile<number[]>({
      path,
      empty: [],
      parse: (text) => {
        const parsed = parseAgentUsers(text);
        return parsed.ok ? resolveAgentUsers(parsed.value, options.passwd) : parsed;
      },
      onLoad: (state, change) => {
        if (!change.ok) {
          options.log.error({ error: state.error, agentUsers: state.value.length }, `agent users file rejected; keeping last good. Fix ${path}`);
        } else if (state.value.length === 0) {
          options.log.error(
            { agentUsers: 0, missing: change.missing },
            `no agent users configured: only root, the service user and the link are served. To fix, ${fix}`,
          );
        } else {
          options.log.info({ agentUsers: state.value.length, uids: state.value, generation: state.generation }, 'agent users loaded');
        }
      },
    });
  }

  async start(): Promise<void> {
    await this.file?.start();
  }

  reload(): Promise<void> {
    return this.file?.reload() ?? Promise.resolve();
  }

  async close(): Promise<void> {
    await this.file?.close();
  }

  /** A UID this service serves as an agent (`--allowed-uids`, the agent-users file). */
  isAgent(uid: number): boolean {
    return (this.options.fixed?.has(uid) ?? false) || (this.file?.current.value.includes(uid) ?? false);
  }

  async allows(uid: number): Promise<boolean> {
    if (this.options.always.has(uid) || (this.options.fixed?.has(uid) ?? false) || (this.file?.current.value.includes(uid) ?? false)) return true;
    const dynamic = this.options.alwaysDynamic ?? [];
    if (dynamic.length === 0 || uid < DYNAMIC_UID_MIN || uid > DYNAMIC_UID_MAX) return false;
    const name = await (this.options.userName ?? nssUserName)(uid);
    return name !== undefined && dynamic.includes(name);
  }
}
