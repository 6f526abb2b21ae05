/**
 * The parts' default addresses and limits, in a module that imports nothing: `doctor` and
 * `status` show them in --help without loading the forwarder or the cli-proxy.
 */
export const DEFAULT_FORWARDER_LISTEN = '127.0.0.1:14323';
export const DEFAULT_CLI_PROXY_LISTEN = '127.0.0.1:14324';
export const DEFAULT_CLI_BODY_LIMIT = 64 * 1024 * 1024;
