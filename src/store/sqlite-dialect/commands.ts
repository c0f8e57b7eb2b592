import { commandText, checkCommandCursor } from '../commands.js';
import type { CommandInput, CommandQuery, CommandRow } from '../types.js';
import type { Spelling } from './statements.js';

/**
 * The command log's statements for the SQLite dialect (the better-sqlite3
 * store and D1 share them, as ./statements.ts): the row, a page, the sweep.
 * Portable: no driver import.
 */

export const COMMAND_COLUMNS =
  'at, route, method, path, entity, fence, idempotency_key, scope, caller, tool, outcome, decision, status, upstream_ms, request_id, client_request_id, payload_sha256';

/**
 * One row. `outcome` is the bound `@outcome`, or (a finish's row on D1)
 * an SQL expression that says `late-finish` when the finish will not be recorded.
 */
export const insertCommand = (d: Spelling, outcome = '@c_outcome'): string => `INSERT INTO commands (${COMMAND_COLUMNS})
  SELECT ${d.now}, @c_route, @c_method, @c_path, @c_entity, CAST(@c_fence AS INTEGER), @c_key, @c_scope, @c_caller, @c_tool,
    ${outcome}, @c_decision, ${d.int('c_status')}, @c_upstream_ms, @c_request_id, @c_client_request_id, @c_sha`;

/** The bound values of `insertCommand` (prefixed `c_`, so they sit beside a finish's own). Fences as decimal text. */
export function commandParams(c: CommandInput): Record<string, unknown> {
  const t = commandText(c);
  return {
    c_route: t.route,
    c_method: t.method,
    c_path: t.path,
    c_entity: t.entity,
    c_fence: t.fence,
    c_key: t.idempotencyKey,
    c_scope: t.scope,
    c_caller: t.caller,
    c_tool: t.tool,
    c_outcome: t.outcome,
    c_decision: t.decision,
    c_status: t.status,
    c_upstream_ms: t.upstreamMs,
    c_request_id: t.requestId,
    c_client_request_id: t.clientRequestId,
    c_sha: t.payloadSha256,
  };
}

/**
 * The same row with positional parameters (`commandValues`): the
 * better-sqlite3 store writes one per request and binds positional
 * parameters faster than named ones (../sqlite/admission-rows.ts). Made from
 * `insertCommand` itself, each `@name` a `?` in the same place, so the
 * row's columns and values are written down once.
 */
const NAMED_ROW = insertCommand({ now: '@now', int: (name) => `@${name}` });
const ROW_PARAMS = [...NAMED_ROW.matchAll(/@(\w+)/g)].map((m) => m[1]!);
export const INSERT_COMMAND_POSITIONAL = NAMED_ROW.replace(/@\w+/g, '?');

/** The values of INSERT_COMMAND_POSITIONAL: `now` (the transaction's database time), then the bounded row (`commandParams`). */
export function commandValues(c: CommandInput, outcome: CommandInput['outcome'], now: number): unknown[] {
  const params: Record<string, unknown> = commandParams(c);
  params.now = now;
  params.c_outcome = outcome;
  return ROW_PARAMS.map((name) => params[name]);
}

/** A page, newest first (`ORDER BY commands.id`: a bare `id` would be the text alias). */
export function commandsPage(d: Spelling, query: CommandQuery): { sql: string; params: Record<string, unknown> } {
  checkCommandCursor(query);
  const where: string[] = [];
  const params: Record<string, unknown> = { limit: query.limit + 1 };
  const add = (cond: string, name: string, value: unknown) => (where.push(cond), (params[name] = value));
  if (query.entity !== undefined) add('entity = @entity', 'entity', query.entity);
  if (query.key !== undefined) add('idempotency_key = @key', 'key', query.key);
  if (query.route !== undefined) add('route = @route', 'route', query.route);
  if (query.caller !== undefined) add('caller = @caller', 'caller', query.caller);
  if (query.since !== undefined) add('at >= @since', 'since', query.since.getTime());
  if (query.until !== undefined) add('at < @until', 'until', query.until.getTime());
  if (query.cursor !== undefined) add(`commands.id < ${d.int('cursor')}`, 'cursor', query.cursor);
  const sql = `SELECT CAST(id AS TEXT) AS id, at, route, method, path, entity, CAST(fence AS TEXT) AS fence, idempotency_key, scope, caller, tool,
    outcome, decision, status, upstream_ms, request_id, client_request_id, payload_sha256
    FROM commands ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY commands.id DESC LIMIT ${d.int('limit')}`;
  return { sql, params };
}

const str = (v: unknown): string | null => (v === null || v === undefined ? null : String(v));
const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

export function toCommand(r: Record<string, unknown>): CommandRow {
  return {
    id: String(r.id),
    at: new Date(Number(r.at)),
    route: str(r.route),
    method: str(r.method),
    path: str(r.path),
    entity: str(r.entity),
    fence: str(r.fence),
    idempotencyKey: str(r.idempotency_key),
    scope: str(r.scope),
    caller: str(r.caller),
    tool: str(r.tool),
    outcome: String(r.outcome),
    decision: str(r.decision),
    status: num(r.status),
    upstreamMs: num(r.upstream_ms),
    requestId: str(r.request_id),
    clientRequestId: str(r.client_request_id),
    payloadSha256: str(r.payload_sha256),
  };
}
