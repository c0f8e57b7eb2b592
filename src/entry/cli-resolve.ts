import { parseArgs } from 'node:util';
import { parseDuration } from '../core/duration.js';
import { answerProblem } from './cli-audit.js';
import { CliError, gatewayFetch, parseUrlFlag, reportError, UsageError } from './cli-errors.js';
import { RESOLVE_UNKNOWN_HELP } from './cli-help.js';

/**
 * `fencegate resolve-unknown`: the bulk release of a route's outcome_unknown
 * records in a time window, through the running gateway's admin API
 * (`POST <adminPrefix>/v1/idempotency/resolve-unknown`, src/http/audit/bulk-resolve.ts).
 * Prints the answer as one JSON line; exit 0 also when nothing matched.
 */
export async function resolveUnknownCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      url: { type: 'string' },
      token: { type: 'string' },
      route: { type: 'string' },
      from: { type: 'string' },
      to: { type: 'string' },
      note: { type: 'string' },
      'dry-run': { type: 'boolean' },
      'admin-prefix': { type: 'string', default: '/_fencegate' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    process.stdout.write(RESOLVE_UNKNOWN_HELP);
    return 0;
  }
  const usage = (message: string) => reportError(new UsageError(message), 'resolve-unknown');
  if (values.url === undefined) return usage('resolve-unknown needs --url URL (a running gateway)');
  if (values.route === undefined || values.route === '') return usage('resolve-unknown needs --route NAME');
  if (values.from === undefined || values.to === undefined)
    return usage('resolve-unknown needs --from T and --to T (ISO 8601 or a duration back from now, e.g. 2h)');
  const now = Date.now();
  const from = timeFlag('--from', values.from, now);
  const to = timeFlag('--to', values.to, now);
  if (from >= to) return usage('--from must be before --to');
  const base = parseUrlFlag('--url', values.url);
  const token = values.token ?? process.env.FENCEGATE_TOKEN;
  const body = {
    route: values.route,
    from: new Date(from).toISOString(),
    to: new Date(to).toISOString(),
    outcome: 'released',
    ...(values.note !== undefined ? { note: values.note } : {}),
    ...(values['dry-run'] ? { dry_run: true } : {}),
  };
  const res = await gatewayFetch(new URL(`${values['admin-prefix']}/v1/idempotency/resolve-unknown`, base), {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new CliError(await answerProblem(res, token !== undefined && token !== ''));
  process.stdout.write(`${JSON.stringify(await res.json())}\n`);
  return 0;
}

/** A date, or a date and time of day with its offset (`Z` or `±HH:MM`). */
const ISO_TIME = /^\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})?)?$/i;

/**
 * An ISO 8601 time or a duration back from `now`, in epoch milliseconds. A
 * time of day must carry its offset: JavaScript reads `2026-05-01T10:00` as
 * the local time of the machine running the CLI (a date alone as UTC), so the
 * window would silently shift by the machine's zone.
 */
function timeFlag(flag: string, value: string, now: number): number {
  const ago = parseDuration(value);
  if (ago !== null) return now - ago;
  const iso = ISO_TIME.exec(value);
  const t = iso ? Date.parse(value) : NaN;
  if (Number.isNaN(t)) throw new UsageError(`${flag} "${value}" is not an ISO 8601 time or a duration such as 2h`);
  if (value.includes('T') && iso![1] === undefined) {
    throw new UsageError(`${flag} "${value}" has a time of day but no offset: add Z (UTC) or one such as +02:00`);
  }
  return t;
}
