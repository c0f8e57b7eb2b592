import { ConfigError } from '../config/load.js';

/**
 * How the CLI fails (docs/cli.md): one line on stderr,
 * `fencegate: <what went wrong and what to do>`, and an exit code: 2 for a
 * usage error (a wrong flag or value; the same command cannot succeed), 1
 * for everything else. A stack trace only with `FENCEGATE_DEBUG=1`: the
 * operator reading the line is not the one debugging the CLI.
 */
export class UsageError extends Error {
  override readonly name = 'UsageError';
  readonly code = 'usage';
}

/** A failure explained for the operator (unreachable gateway, busy port, …): exit 1, no stack. */
export class CliError extends Error {
  override readonly name = 'CliError';
  readonly code = 'cli';
}

/** The exit code and the one line for an error thrown out of a command. */
export function describeError(err: unknown, command: string | undefined): { code: number; line: string } {
  const e = err as (Error & { code?: unknown; cause?: unknown; port?: unknown; address?: unknown }) | undefined;
  const help = command === undefined ? 'fencegate --help' : `fencegate ${command} --help`;
  if (err instanceof UsageError) return { code: 2, line: `${err.message} (${help})` };
  if (err instanceof CliError || err instanceof ConfigError || (err instanceof Error && /ConfigError$/.test(err.name))) return { code: 1, line: err.message };
  switch (e?.code) {
    // node:util parseArgs.
    case 'ERR_PARSE_ARGS_UNKNOWN_OPTION': {
      const flag = /'([^']+)'/.exec(e.message)?.[1] ?? 'option';
      return { code: 2, line: `unknown option ${flag} (${help} lists the options)` };
    }
    case 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE':
      return { code: 2, line: `${e.message.replace(/^Option '(\S+)[^']*' argument missing.*/, '$1 needs a value').replace(/'/g, '')} (${help})` };
    case 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL':
      return { code: 2, line: `unexpected argument ${/'([^']+)'/.exec(e.message)?.[1] ?? ''} (${help})` };
    case 'EADDRINUSE':
    case 'EACCES':
      return { code: 1, line: listenProblem(e) };
  }
  const message = err instanceof Error ? err.message : String(err);
  return { code: 1, line: `${message} (FENCEGATE_DEBUG=1 shows the stack)` };
}

function listenProblem(e: { code?: unknown; port?: unknown; address?: unknown; message: string }): string {
  const where = e.port !== undefined ? `${String(e.address ?? '')}:${String(e.port)}` : '';
  if (e.code === 'EACCES') return `not allowed to listen on ${where}: pick a port above 1023 with --port N or listen.port`;
  return `${where} is already in use (another fencegate?): pick another port with --port N or listen.port in the config`;
}

/** Prints the error's line (and, with FENCEGATE_DEBUG=1, its stack) and returns the exit code. */
export function reportError(err: unknown, command: string | undefined, env = process.env): number {
  const { code, line } = describeError(err, command);
  process.stderr.write(`fencegate: ${line}\n`);
  if (env.FENCEGATE_DEBUG === '1' && err instanceof Error && err.stack) process.stderr.write(`${err.stack}\n`);
  return code;
}

/** `new URL` for a `--url` flag: a usage error naming the flag instead of `TypeError: Invalid URL`. */
export function parseUrlFlag(flag: string, value: string): URL {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new UsageError(`${flag} "${value}" is not a URL (e.g. http://127.0.0.1:8080)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new UsageError(`${flag} must be an http:// or https:// URL, not "${value}"`);
  return url;
}

/**
 * `fetch` to the gateway: a gateway that does not answer is one line naming
 * the URL and the cause (`connect ECONNREFUSED 127.0.0.1:8080`), not `fetch failed`.
 */
export async function gatewayFetch(url: URL, init: RequestInit): Promise<Response> {
  try {
    return await fetch(url, init);
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    const why = cause?.message ?? (err as Error).message;
    throw new CliError(`cannot reach the gateway at ${url.origin}: ${why}${cause?.code === 'ECONNREFUSED' ? ' (is fencegate serve running there?)' : ''}`, {
      cause: err,
    });
  }
}
