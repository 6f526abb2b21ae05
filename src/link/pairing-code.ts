import { ConfigError } from '../errors.js';

/**
 * Reads the pairing code for `enroll`: prompted on a terminal with echo off (it must not
 * stay on screen or in a scrollback), else the first non-empty line of stdin. Never argv.
 */

/** More than this on stdin is not a pairing code (a file piped in by mistake). */
const STDIN_LIMIT = 4096;

export interface CodeInput {
  stdin: NodeJS.ReadStream;
  prompt: NodeJS.WriteStream;
}

export function readPairingCode(io: CodeInput = { stdin: process.stdin, prompt: process.stderr }): Promise<string> {
  return io.stdin.isTTY ? promptHidden(io) : readFirstLine(io.stdin);
}

async function readFirstLine(stdin: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of stdin) {
    const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    size += buf.length;
    if (size > STDIN_LIMIT) throw new ConfigError('stdin holds more than a pairing code: give only the code, on one line');
    chunks.push(buf);
  }
  const line = Buffer.concat(chunks)
    .toString('utf8')
    .split(/\r?\n/)
    .map((l) => l.trim())
    .find((l) => l.length > 0);
  if (line === undefined) {
    throw new ConfigError('no pairing code on stdin: run enroll on a terminal to be prompted, or pipe the code in from a file (… < code.txt)');
  }
  return line;
}

function promptHidden({ stdin, prompt }: CodeInput): Promise<string> {
  prompt.write('Pairing code (input hidden): ');
  return new Promise<string>((resolve, reject) => {
    let code = '';
    const finish = (err?: Error): void => {
      stdin.off('data', onData);
      stdin.setRawMode(false);
      stdin.pause();
      prompt.write('\n');
      if (err) reject(err);
      else if (code.trim() === '') reject(new ConfigError('no pairing code entered'));
      else resolve(code.trim());
    };
    const onData = (data: Buffer): void => {
      for (const ch of data.toString('utf8')) {
        if (ch === '\r' || ch === '\n' || ch === '\u0004') return finish();
        if (ch === '\u0003') return finish(new ConfigError('cancelled'));
        if (ch === '\u007f' || ch === '\b') code = code.slice(0, -1);
        else if (code.length < STDIN_LIMIT) code += ch;
      }
    };
    stdin.setRawMode(true);
    stdin.resume();
    stdin.on('data', onData);
  });
}
