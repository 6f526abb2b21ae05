#!/usr/bin/env node
/**
 * `acdemo`, the demo shell CLI for `agent-connectors dev`: a stand-in for a SaaS CLI such
 * as `ntn`. It reads its API base URL and credential from the environment, as real CLIs
 * do; through its shim it gets the cli-proxy's URL and a placeholder, never the token.
 */
const base = process.env.ACDEMO_URL;
const credential = process.env.ACDEMO_TOKEN;
const [command = 'whoami', ...rest] = process.argv.slice(2);

async function main(): Promise<number> {
  if (!base || !credential) {
    process.stderr.write('acdemo: ACDEMO_URL and ACDEMO_TOKEN must be set (run it through its shim)\n');
    return 2;
  }
  if (command !== 'whoami' && command !== 'items') {
    process.stderr.write(`acdemo: unknown command "${command}" (whoami | items [query])\n`);
    return 2;
  }
  const url = `${base.replace(/\/+$/, '')}/${command}${rest.length ? `?q=${encodeURIComponent(rest.join(' '))}` : ''}`;
  const res = await fetch(url, { headers: { authorization: `Bearer ${credential}` } });
  process.stdout.write(`${await res.text()}\n`);
  return res.ok ? 0 : 1;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`acdemo: ${(err as Error).message}\n`);
    process.exitCode = 1;
  },
);
