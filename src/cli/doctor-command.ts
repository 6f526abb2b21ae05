import { resolve } from 'node:path';
import type { Command } from 'commander';
import { AGENT_USERS_FILE } from '../data/agent-users.js';
import { DEFAULT_CREDENTIAL_PATH } from '../link/enroll.js';
import { version } from '../version.js';
import { DEFAULT_CLI_PROXY_LISTEN, DEFAULT_FORWARDER_LISTEN } from '../wiring/defaults.js';
import { layoutFrom } from '../wiring/options.js';

/** Where doctor and status look: the state root, the two parts' URLs, the credential. */
export function addHostOptions(cmd: Command): Command {
  return cmd
    .option('--state-dir <dir>', 'state root')
    .option('--handoff <dir>', 'renewal hand-off directory (default: <state>/handoff)')
    .option('--forwarder-url <url>', 'forwarder base URL', `http://${DEFAULT_FORWARDER_LISTEN}`)
    .option('--cli-proxy-url <url>', 'cli-proxy base URL', `http://${DEFAULT_CLI_PROXY_LISTEN}`)
    .option('--credential <file>', 'the host credential; its presence marks the host enrolled', DEFAULT_CREDENTIAL_PATH);
}

/**
 * Where doctor's report goes and what its exit code becomes: the process's stdout and
 * exit code, unless the caller gives its own (a test running the command in-process,
 * through the same options and output, without a Node start per run).
 */
export interface DoctorOutput {
  write(text: string): void;
  exit(code: number): void;
}

const processOutput: DoctorOutput = {
  write: (text) => {
    process.stdout.write(text);
  },
  exit: (code) => {
    process.exitCode = code;
  },
};

export function registerDoctorCommand(program: Command, out: DoctorOutput = processOutput): void {
  addHostOptions(
    program
      .command('doctor')
      .description('check users, modes, secrets, ports, units and token freshness, and on an enrolled host the link, versions and drift; print how to fix each problem'),
  )
    .option('--agent-user <name>', 'the user AI agents run as: checked to read no secret')
    .option('--agent-users-file <file>', "the proxies' agent-users file: missing or naming nobody (every agent refused) is a problem", AGENT_USERS_FILE)
    .option('--ca-bundle <file>', "the shims' CA bundle (TLS mode), if the cli-proxy was given another (default: as cli-proxy --ca-bundle)")
    .option('--no-systemd', 'skip the unit checks (hosts without systemd)')
    .option('--json', 'print one JSON document (format agent-connectors.doctor/1: checks, codes, summary)')
    .action(async (opts: { stateDir?: string; handoff?: string; caBundle?: string; agentUser?: string; agentUsersFile: string; forwarderUrl: string; cliProxyUrl: string; credential: string; systemd: boolean; json?: boolean }) => {
      // Loaded when doctor runs: `status` shares these options and needs none of the checks.
      const [{ diagnose }, { doctorReport }] = await Promise.all([import('../doctor/doctor.js'), import('../doctor/report.js')]);
      const layout = layoutFrom(opts);
      const now = Date.now();
      const { findings, link } = await diagnose({
        stateDir: layout.root,
        handoffDir: layout.handoff,
        caBundle: opts.caBundle === undefined ? undefined : resolve(opts.caBundle),
        agentUser: opts.agentUser,
        agentUsersFile: resolve(opts.agentUsersFile),
        forwarderUrl: opts.forwarderUrl,
        cliProxyUrl: opts.cliProxyUrl,
        credentialPath: resolve(opts.credential),
        systemd: opts.systemd,
        now,
      });
      const problems = findings.filter((f) => f.level === 'problem').length;
      if (opts.json) out.write(`${JSON.stringify(doctorReport(findings, link.enrolment, version, now), null, 2)}\n`);
      else {
        for (const f of findings) {
          const mark = f.level === 'ok' ? 'ok  ' : f.level === 'warn' ? 'warn' : 'FAIL';
          out.write(`${mark}  ${f.check}: ${f.detail}\n${f.fix ? `      fix: ${f.fix}\n` : ''}`);
        }
        out.write(problems ? `\n${problems} problem(s)\n` : '\nno problems\n');
      }
      out.exit(problems ? 1 : 0);
    });
}
