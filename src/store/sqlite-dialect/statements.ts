import { boundRejectionText } from '../bounds.js';
import type { AuditInfo, RejectionQuery, SweepKind } from '../types.js';

/**
 * The SQL text the better-sqlite3 store (../sqlite/) and the D1 store
 * (../d1/) share: the same tables (migrations/gateway/sqlite), so one
 * definition of each statement, written once here. What differs between the
 * two drivers is only how a statement spells what it is given (`Spelling`).
 * D1's admission program (../d1/admission.ts) stays D1's own: it is the
 * translation of the pure rules (../../core/admission.ts) that the SQLite
 * store runs in TypeScript (../sqlite/admission-rows.ts).
 *
 * Parameters are named (`@name`); better-sqlite3 binds them by name, D1's
 * binder turns them into `?N` (../d1/binding.ts). Portable: no driver import.
 */

/** The database clock in integer milliseconds (G6): the only clock in expiry conditions. */
export const NOW_MS = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/**
 * How a driver spells a statement's inputs. better-sqlite3 binds the
 * transaction's database time (`@now`, read once per write transaction, so
 * every decision of a group commits at one database time) and integers as
 * they are. D1 runs each statement as its own transaction, so it reads the
 * clock inside the statement, and it binds no BigInt (fences travel as
 * decimal text) and numbers as doubles: SQL CASTs them.
 */
export interface Spelling {
  /** The database time (ms) a write decides with. */
  readonly now: string;
  /** The named integer parameter `name`. */
  int(name: string): string;
}

export const SQLITE: Spelling = { now: '@now', int: (name) => `@${name}` };
export const D1: Spelling = { now: NOW_MS, int: (name) => `CAST(@${name} AS INTEGER)` };

// ── The rejection log (DESIGN §2 G5) ────────────────────────────────────────

/** The rejection-log columns every insert names (the statements of the D1 admission and finish too). */
export const REJECTION_COLUMNS =
  'at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, client_request_id, tool';
/** The values of the request's audit fields for those columns, as `rejectionParams` names them. */
export const REJECTION_AUDIT_VALUES = '@log_key, @caller, @method, @path, @sha, @request_id, @client_request_id, @tool';

/** @now (SQLITE) @reason @log_entity @presented @current, `rejectionParams`: one row of the log. */
export const insertRejection = (d: Spelling): string => `INSERT INTO rejections (${REJECTION_COLUMNS}, detail)
  VALUES (${d.now}, @reason, @log_entity, ${d.int('presented')}, ${d.int('current')}, ${REJECTION_AUDIT_VALUES}, @detail)`;

/**
 * The bounded text of the rejection row a statement may write (../bounds.ts),
 * as bound parameters: `@log_entity` and `@log_key` for the row, while a
 * decision itself uses the whole `@entity` and `@key`. The fence history
 * takes the same bounded caller and request id.
 */
export function rejectionParams(r: { entity: string | null; key?: string | null; idempotencyKey?: string | null; audit: AuditInfo; detail?: string | null }) {
  const text = boundRejectionText({ entity: r.entity, idempotencyKey: r.idempotencyKey ?? r.key ?? null, audit: r.audit, detail: r.detail ?? null });
  return {
    log_entity: text.entity,
    log_key: text.idempotencyKey,
    caller: text.caller,
    method: text.method,
    path: text.path,
    sha: text.payloadSha256,
    request_id: text.requestId,
    client_request_id: text.clientRequestId,
    tool: text.tool,
    detail: text.detail,
  };
}

/**
 * A page of the rejection log, newest first, filtered by what `query` names.
 * Every ORDER BY of a column read as text names its table: a bare `id` there
 * would be the text alias, and '9' sorts after '10'.
 */
export function rejectionsPage(d: Spelling, query: RejectionQuery): { sql: string; params: Record<string, unknown> } {
  const where: string[] = [];
  const params: Record<string, unknown> = { limit: query.limit + 1 };
  const add = (cond: string, name: string, value: unknown) => (where.push(cond), (params[name] = value));
  if (query.entity !== undefined) add('entity = @entity', 'entity', query.entity);
  if (query.reason !== undefined) add('reason = @reason', 'reason', query.reason);
  if (query.caller !== undefined) add('caller = @caller', 'caller', query.caller);
  if (query.tool !== undefined) add('tool = @tool', 'tool', query.tool);
  if (query.since !== undefined) add('at >= @since', 'since', query.since.getTime());
  if (query.until !== undefined) add('at < @until', 'until', query.until.getTime());
  if (query.cursor !== undefined) add(`id < ${d.int('cursor')}`, 'cursor', query.cursor);
  const sql = `SELECT CAST(id AS TEXT) AS id, at, reason, entity, CAST(presented_fence AS TEXT) AS presented_fence,
    CAST(current_fence AS TEXT) AS current_fence, idempotency_key, caller, method, path, payload_sha256, request_id, client_request_id, tool, detail
    FROM rejections ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY rejections.id DESC LIMIT ${d.int('limit')}`;
  return { sql, params };
}

/**
 * An accepted rise of an entity's fence (DESIGN §4.1), from `rows` (a VALUES
 * or SELECT clause of entity, fence, at, caller, request_id): fences only
 * rise, so (entity, fence) is one rise, and an equal fence adds nothing.
 */
export const insertFenceHistory = (rows: string): string =>
  `INSERT INTO fence_history (entity, fence, at, caller, request_id) ${rows} ON CONFLICT (entity, fence) DO NOTHING`;

// ── Reads ───────────────────────────────────────────────────────────────────

/** An outcome_unknown record that carries an interim answer now (DESIGN §3.7): one kept, before its expires_at. */
export const LIVE_INTERIM = `state = 'outcome_unknown' AND status IS NOT NULL AND expires_at > ${NOW_MS}`;

/** The record columns of every read, fences as text (D1 returns integers as doubles). Never the body. */
export const RECORD_COLUMNS = `scope, key, state, fingerprint, entity, CAST(fence AS TEXT) AS fence, status, locked_until, created_at, expires_at,
  (${LIVE_INTERIM}) AS interim, attempt_until, request_id, reconcile_result, reconciled_at`;

/** @entity — the entity's row, with the database time its slot is judged by. */
export const ENTITY_INFO = `SELECT entity, CAST(fence AS TEXT) AS fence, accepted_at, inflight_until, ${NOW_MS} AS now
  FROM fence_entities WHERE entity = @entity`;

/** @scope @key @created_at — the interim answer of this attempt's outcome_unknown record, while its time lasts. */
export const interimOf = (d: Spelling): string => `SELECT status, headers, body FROM idempotency_records
  WHERE scope = @scope AND key = @key AND created_at = ${d.int('created_at')} AND ${LIVE_INTERIM}`;

/** @scope @key @created_at @result — the reconciler's last answer about this attempt's outcome_unknown record, at the database time. */
export const noteReconcile = (d: Spelling): string => `UPDATE idempotency_records SET reconcile_result = @result, reconciled_at = ${NOW_MS}
  WHERE scope = @scope AND key = @key AND created_at = ${d.int('created_at')} AND state = 'outcome_unknown'`;

/** @key — every record with the key, across scopes. */
export const RECORDS_BY_KEY = `SELECT ${RECORD_COLUMNS} FROM idempotency_records WHERE key = @key ORDER BY scope`;

// ── Record and slot conditions (DESIGN §3.5, §3.7) ──────────────────────────

/**
 * The SET of a record whose outcome is now unknown (G4): its lock is gone
 * with its gateway; the attempt's lock end stays (taken from the lock for a
 * record written before it was kept: DESIGN §3.12).
 */
export const MARK_UNKNOWN = "state = 'outcome_unknown', attempt_until = coalesce(attempt_until, locked_until), locked_until = NULL";

/** A completed record past its retention at `now`: forgotten, by the admission or the sweeper. */
export const expiredRecord = (now: string): string => `state = 'completed' AND expires_at <= ${now}`;
/** An in_progress record whose lock expired at `now`: its gateway died. */
export const lockExpired = (now: string): string => `state = 'in_progress' AND locked_until <= ${now}`;
/** An entity whose serial slot is free or expired (a dead gateway's) at `now`. */
export const slotFree = (now: string): string => `(inflight_owner IS NULL OR inflight_until <= ${now})`;

/**
 * @status @headers @body @retention_ms — a record completed with its stored
 * response, kept for replay from the database time on; `where` says whose
 * it is to complete (the owner's finish, an operator's resolution).
 */
export const completeRecord = (d: Spelling, where: string): string =>
  `UPDATE idempotency_records SET state = 'completed', status = ${d.int('status')}, headers = @headers, body = @body,
    locked_until = NULL, expires_at = ${NOW_MS} + ${d.int('retention_ms')}
  WHERE ${where}`;

// ── The sweeper (DESIGN §4.4, ../sweep.ts) ──────────────────────────────────

/** One kind of sweep: a batch of at most @batch rows, and the backlog counted up to @cap. */
export interface SweepStatements {
  run: string;
  count: string;
}

/**
 * The sweep statements, one kind each. Parameters: `now` (SQLITE), and
 * @retention_ms for the kinds with a retention.
 *
 * The sweeps name no ORDER BY: which rows past retention go first does not
 * matter, and with `ORDER BY id` SQLite walks the table by id, so the last
 * (short) batch of every sweep read every row; without it each batch reads
 * the index range of the rows it deletes (EXPLAIN QUERY PLAN). The indexes:
 * fence_entities_accepted, fence_history_at, operator_actions_at (0006).
 */
export function sweepStatements(d: Spelling): Record<SweepKind, SweepStatements> {
  const before = `${d.now} - ${d.int('retention_ms')}`;
  const batch = (table: string, id: string, where: string, change = `DELETE FROM ${table}`): SweepStatements => ({
    run: `${change} WHERE (${id}) IN (SELECT ${id} FROM ${table} WHERE ${where} LIMIT ${d.int('batch')})`,
    count: `SELECT count(*) AS n FROM (SELECT 1 FROM ${table} WHERE ${where} LIMIT ${d.int('cap')})`,
  });
  return {
    expiredRecords: batch('idempotency_records', 'rowid', expiredRecord(d.now)),
    unknownRecords: batch('idempotency_records', 'rowid', lockExpired(d.now), `UPDATE idempotency_records SET ${MARK_UNKNOWN}`),
    oldRejections: batch('rejections', 'id', `at < ${before}`),
    // entityRetention, never an entity whose serial slot is live (docs/configuration.md:
    // the safety condition of entityRetention).
    oldEntities: batch('fence_entities', 'entity', `accepted_at < ${before} AND ${slotFree(d.now)}`),
    oldFenceHistory: batch('fence_history', 'entity, fence', `at < ${before}`),
    oldOperatorActions: batch('operator_actions', 'id', `at < ${before}`),
    // The command log (./commands.ts), index commands_at (0011).
    oldCommands: batch('commands', 'id', `at < ${before}`),
  };
}
