import { completeRecord, NOW_MS, RECORD_COLUMNS, type Spelling } from './statements.js';

/**
 * The audit statements (DESIGN §4.1) of the SQLite dialect, shared by the
 * better-sqlite3 store (../sqlite/audit.ts) and the D1 store
 * (../d1/audit.ts). Each one's parameters are named in its comment.
 */

/** The operator-action columns as read, id and fence as text (so an ORDER BY names the table's column). */
export const ACTION_COLUMNS =
  'CAST(id AS TEXT) AS id, at, action, scope, key, entity, CAST(fence AS TEXT) AS fence, fingerprint, status, operator, note, request_id';
/** The insert of an operator-action row; each store gives its values. */
export const INSERT_ACTION = 'INSERT INTO operator_actions (at, action, scope, key, entity, fence, fingerprint, status, operator, note, request_id)';
/**
 * @scope @key @created_at (ms, or NULL) — only an outcome_unknown record is the
 * operator's to settle, and, given its created_at, only the attempt the
 * operator saw: a later attempt with the same key is another request's
 * outcome, not the one the operator decided on.
 */
export const unknownRecord = (d: Spelling): string =>
  `scope = @scope AND key = @key AND state = 'outcome_unknown' AND (@created_at IS NULL OR created_at = ${d.int('created_at')})`;

/**
 * @settle_ms @legacy_ms (or both NULL) — a release asked for with `notBefore`:
 * only once the database clock is `settle_ms` past the attempt's own lock end
 * (`attempt_until`), or, for a record written before that was kept,
 * `legacy_ms` past its admission (DESIGN §3.12: a reconciler's "not found" is
 * trusted only when the attempt can no longer be in flight nor be still
 * landing). Read in the write itself, never in TypeScript (G6). Never a
 * record that keeps (or kept) an interim answer (`status` set while
 * `outcome_unknown`: a 202 whose job may still run, an MCP task's handle):
 * the command was accepted upstream, so no "not found" releases it, also
 * once its interim answer is past its retention.
 */
export const quietEnough = (d: Spelling): string =>
  `(@settle_ms IS NULL OR (status IS NULL AND coalesce(attempt_until + ${d.int('settle_ms')}, created_at + ${d.int('legacy_ms')}) <= ${NOW_MS}))`;

export function auditStatements(d: Spelling) {
  return {
    // @entity @cursor (fence, or NULL) @limit
    history: `SELECT CAST(fence AS TEXT) AS fence, at, caller, request_id FROM fence_history
      WHERE entity = @entity AND (@cursor IS NULL OR fence < ${d.int('cursor')}) ORDER BY fence_history.fence DESC LIMIT ${d.int('limit')}`,
    // @state @after_at @after_scope @after_key (all NULL on the first page) @limit — keyset on
    // (created_at, scope, key), newest first.
    records: `SELECT ${RECORD_COLUMNS} FROM idempotency_records
      WHERE state = @state AND (@after_at IS NULL OR (created_at, scope, key) < (${d.int('after_at')}, @after_scope, @after_key))
      ORDER BY created_at DESC, scope DESC, key DESC LIMIT ${d.int('limit')}`,
    // @scope @key @created_at @status @headers @body @retention_ms
    complete: completeRecord(d, unknownRecord(d)),
    // @scope @key @created_at @settle_ms @legacy_ms
    release: `DELETE FROM idempotency_records WHERE ${unknownRecord(d)} AND ${quietEnough(d)}`,
    // @cursor (id, or NULL) @limit
    actions: `SELECT ${ACTION_COLUMNS} FROM operator_actions
      WHERE (@cursor IS NULL OR id < ${d.int('cursor')}) ORDER BY operator_actions.id DESC LIMIT ${d.int('limit')}`,
    stats: `SELECT (SELECT count(*) FROM rejections) AS rejections,
      (SELECT count(*) FROM idempotency_records WHERE state = 'outcome_unknown') AS unknown`,
  };
}
