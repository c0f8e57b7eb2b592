import { checkCommandCursor, commandText } from '../commands.js';
import type { CommandInput, CommandPage, CommandQuery, CommandRow } from '../types.js';
import type { PgContext } from './query.js';
import { decodeNullable, encodeNullable, encodeText } from './text.js';

/**
 * The command log on PostgreSQL (DESIGN §4.1 `commands`).
 *
 * A finish's row is written by the finish's own statement: the call of
 * fencegate_finish (or fencegate_finish_many, for a group) sits in a CTE,
 * and a data-modifying CTE beside it inserts the row from the call's result
 * (`late-finish` when the finish was not recorded; for a group, only the
 * elements that committed). One statement is one transaction, so the
 * outcome and its row exist together or not at all, and the functions of
 * ./sql stay as they are (a replica of the previous release still runs
 * them during a rolling upgrade). An element a group re-runs alone (a
 * deadlock) writes its row in its lone statement.
 */

/** The command row's columns, as the finish statements and the standalone insert name them. */
const COLUMNS =
  'at, route, method, path, entity, fence, idempotency_key, scope, caller, tool, outcome, decision, status, upstream_ms, request_id, client_request_id, payload_sha256';
/** The SQL type of each bound value below, in order. */
const TYPES = ['text', 'text', 'text', 'text', 'bigint', 'text', 'text', 'text', 'text', 'text', 'text', 'integer', 'double precision', 'text', 'text', 'text'];
/** How many values a command row binds. */
export const COMMAND_VALUES = TYPES.length;

/** The bound values of one row (nulls when `c` is absent: a finish without a row), text escaped (./text.ts). */
export function commandValues(c: CommandInput | undefined): unknown[] {
  if (c === undefined) return TYPES.map(() => null);
  const t = commandText(c);
  return [
    encodeText(t.route),
    encodeText(t.method),
    encodeText(t.path),
    encodeNullable(t.entity),
    t.fence,
    encodeNullable(t.idempotencyKey),
    encodeNullable(t.scope),
    encodeNullable(t.caller),
    encodeNullable(t.tool),
    t.outcome,
    encodeText(t.decision),
    t.status,
    t.upstreamMs,
    encodeText(t.requestId),
    encodeNullable(t.clientRequestId),
    encodeNullable(t.payloadSha256),
  ];
}

/** `$first`, … typed: the values of one row (`array`: one array per column, for a group). */
function params(first: number, array: boolean): string[] {
  return TYPES.map((type, i) => `$${first + i}::${type}${array ? '[]' : ''}`);
}

/**
 * `one` (`SELECT recorded FROM fencegate_finish($1 … $n)`) with the row of
 * its command: the row's values are `$n+1 …` (`commandValues`), all null
 * when the finish carries none (no row then).
 */
export function finishOneWithCommand(ctx: PgContext, one: string, n: number): string {
  const [route, method, path, entity, fence, key, scope, caller, tool, outcome, ...rest] = params(n + 1, false);
  return `WITH f AS (${one}),
    c AS (INSERT INTO ${ctx.table('commands')} (${COLUMNS})
      SELECT clock_timestamp(), ${route}, ${method}, ${path}, ${entity}, ${fence}, ${key}, ${scope}, ${caller}, ${tool},
        CASE WHEN f.recorded THEN ${outcome} ELSE 'late-finish' END, ${rest.join(', ')}
      FROM f WHERE ${outcome} IS NOT NULL)
    SELECT recorded FROM f`;
}

/**
 * `many` (`SELECT ord, recorded, err_code, err_message FROM
 * fencegate_finish_many(…) ORDER BY ord`, $1 … $n) with the rows of its
 * elements' commands: one array per column from `$n+1` on, element i's row
 * at index i, written only for the elements that committed (no error) and
 * carry one.
 */
export function finishManyWithCommands(ctx: PgContext, many: string, n: number): string {
  const names = [
    'route',
    'method',
    'path',
    'entity',
    'fence',
    'key',
    'scope',
    'caller',
    'tool',
    'outcome',
    'decision',
    'status',
    'upstream_ms',
    'request_id',
    'crid',
    'sha',
  ];
  const body = many.replace(/\s+ORDER BY ord\s*$/, '');
  return `WITH f AS (${body}),
    c AS (INSERT INTO ${ctx.table('commands')} (${COLUMNS})
      SELECT clock_timestamp(), u.route, u.method, u.path, u.entity, u.fence, u.key, u.scope, u.caller, u.tool,
        CASE WHEN f.recorded THEN u.outcome ELSE 'late-finish' END, u.decision, u.status, u.upstream_ms, u.request_id, u.crid, u.sha
      FROM f JOIN unnest(${params(n + 1, true).join(', ')}) WITH ORDINALITY AS u(${names.join(', ')}, ord) ON u.ord = f.ord
      WHERE f.err_code IS NULL AND u.outcome IS NOT NULL)
    SELECT ord, recorded, err_code, err_message FROM f ORDER BY ord`;
}

/**
 * Runs a finish statement with its command-log rows; on a schema without
 * the `commands` table (a replica of this release started with `migrate:
 * false` before `fencegate migrate` ran) the same finish without them: the
 * statement failed while being parsed, so nothing of it ran, and a finish
 * that fails would leave its record to become outcome_unknown although the
 * upstream answered. The rows are what is lost until the migration runs.
 */
export async function finishWithRows<R>(
  run: (text: string, values: unknown[]) => Promise<R>,
  withRows: string,
  withoutRows: string,
  values: unknown[],
  finishValues: number,
): Promise<R> {
  try {
    return await run(withRows, values);
  } catch (err) {
    const e = err as { code?: string; message?: string };
    if (e.code !== '42P01' || !/\bcommands\b/.test(e.message ?? '')) throw err;
    return run(withoutRows, values.slice(0, finishValues));
  }
}

/** The standalone rows (outcomes with no finish) and the log's filtered pages. */
export function createCommandLog(ctx: PgContext) {
  const table = ctx.table('commands');
  const insert = `INSERT INTO ${table} (${COLUMNS}) VALUES (now(), ${params(1, false).join(', ')})`;
  return {
    async record(c: CommandInput): Promise<void> {
      await ctx.query(insert, commandValues(c));
    },

    /** Newest first, keyset on id. The filter's shape varies, so the statement is not a named one. */
    async list(query: CommandQuery): Promise<CommandPage> {
      checkCommandCursor(query);
      const where: string[] = [];
      const values: unknown[] = [];
      const add = (cond: (n: string) => string, value: unknown) => {
        values.push(value);
        where.push(cond(`$${values.length}`));
      };
      if (query.entity !== undefined) add((n) => `entity = ${n}`, encodeText(query.entity));
      if (query.key !== undefined) add((n) => `idempotency_key = ${n}`, encodeText(query.key));
      if (query.route !== undefined) add((n) => `route = ${n}`, encodeText(query.route));
      if (query.caller !== undefined) add((n) => `caller = ${n}`, encodeText(query.caller));
      if (query.since !== undefined) add((n) => `at >= ${n}`, query.since);
      if (query.until !== undefined) add((n) => `at < ${n}`, query.until);
      if (query.cursor !== undefined) add((n) => `id < ${n}`, query.cursor);
      values.push(query.limit + 1);
      const text = `SELECT * FROM ${table} ${where.length > 0 ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY id DESC LIMIT $${values.length}`;
      const { rows } = await ctx.query<Record<string, unknown>>(text, values, false);
      const items = rows.slice(0, query.limit).map(toCommand);
      return { items, nextCursor: rows.length > query.limit ? items[items.length - 1]!.id : null };
    },
  };
}

function toCommand(r: Record<string, unknown>): CommandRow {
  const str = (v: unknown) => (v === null || v === undefined ? null : String(v));
  const text = (v: unknown) => decodeNullable(v as string | null);
  return {
    id: String(r.id),
    at: r.at as Date,
    route: text(r.route),
    method: text(r.method),
    path: text(r.path),
    entity: text(r.entity),
    fence: str(r.fence),
    idempotencyKey: text(r.idempotency_key),
    scope: text(r.scope),
    caller: text(r.caller),
    tool: text(r.tool),
    outcome: String(r.outcome),
    decision: text(r.decision),
    status: r.status === null || r.status === undefined ? null : Number(r.status),
    upstreamMs: r.upstream_ms === null || r.upstream_ms === undefined ? null : Number(r.upstream_ms),
    requestId: text(r.request_id),
    clientRequestId: text(r.client_request_id),
    payloadSha256: text(r.payload_sha256),
  };
}
