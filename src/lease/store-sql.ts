/**
 * The statements that act on a claimed job (extend, complete, fail,
 * release) and cancel, written once for both dialects: each backend's
 * queries.ts supplies its words (placeholders, clocks, JSON functions) and
 * documents its parameters. The rule, above all FAIL's decision between
 * requeue and the end, is then the same text on SQLite and PostgreSQL
 * instead of two copies that could drift apart (DESIGN §6).
 *
 * The claim is not here: its picks and locks differ by dialect (SKIP LOCKED,
 * grouped claims on PostgreSQL; one UPDATE in BEGIN IMMEDIATE on SQLite).
 */

/** One dialect's words for the statements below. */
export interface OwnedSqlDialect {
  /** The ownership condition of every statement on a claimed job (DESIGN §6). */
  owned: string;
  /** The time recorded for what happened (`heartbeat_at`, `finished_at`). */
  now: string;
  /** The clock every expiry is written from (`run_after` of a release). */
  clock: string;
  /** `clock` plus `ms` milliseconds (`ms`: SQL of an integer). */
  later(ms: string): string;
}

/** Renews the lease by `leaseMs`. Zero rows: the lease is lost. */
export const extendSql = (d: OwnedSqlDialect, leaseMs: string) => `
UPDATE tool_jobs SET lease_until = ${d.later(leaseMs)}, heartbeat_at = ${d.now}
WHERE ${d.owned}
RETURNING lease_until`;

/** Stores `result` (JSON) and ends the job. Zero rows: the lease is lost, nothing stored. */
export const completeSql = (d: OwnedSqlDialect, result: string) => `
UPDATE tool_jobs SET state = 'succeeded', result = ${result}, finished_at = ${d.now}, lease_until = NULL
WHERE ${d.owned}
RETURNING id`;

/** FAIL's parameters, in the dialect's words. */
export interface FailParams {
  /** The retryable flag, as a boolean expression. */
  retryable: string;
  /** The backoff in milliseconds. */
  backoffMs: string;
  /** The error code: the reason of a job that ends on a non-retryable error. */
  errorCode: string;
  /** The error (JSON) with `attempt` set to the row's attempt. */
  errorWithAttempt: string;
}

/**
 * Requeues the job (retryable, an attempt left, and the retry starts before
 * the deadline) or ends it, in the same statement as the ownership check, so
 * the decision and the check cannot drift apart.
 */
export function failSql(d: OwnedSqlDialect, p: FailParams): string {
  // Requeue: retryable, an attempt left, and the retry starts before the deadline.
  const retry = `(${p.retryable} AND attempt < max_attempts
  AND (deadline_at IS NULL OR ${d.later(p.backoffMs)} < deadline_at))`;
  return `
UPDATE tool_jobs SET
  state = CASE WHEN ${retry} THEN 'queued' ELSE 'failed' END,
  reason = CASE WHEN ${retry} THEN NULL
                WHEN ${p.retryable} AND attempt >= max_attempts THEN 'max_attempts'
                WHEN ${p.retryable} THEN 'deadline'
                ELSE ${p.errorCode} END,
  finished_at = CASE WHEN ${retry} THEN NULL ELSE ${d.now} END,
  error = ${p.errorWithAttempt},
  run_after = ${d.later(p.backoffMs)},
  -- A queued job has no owner; a failed one keeps its last owner for the record.
  owner_id = CASE WHEN ${retry} THEN NULL ELSE owner_id END,
  lease_until = NULL
WHERE ${d.owned}
RETURNING state, reason, run_after`;
}

/** Back to the queue at once; the attempt still counts. */
export const releaseSql = (d: OwnedSqlDialect) => `
UPDATE tool_jobs SET state = 'queued', owner_id = NULL, lease_until = NULL, run_after = ${d.clock}
WHERE ${d.owned}
RETURNING id`;

/** For operators: a queued or running job `id` ends as `cancelled`; no ownership check. */
export const cancelSql = (d: OwnedSqlDialect, id: string) => `
UPDATE tool_jobs SET state = 'cancelled', reason = 'cancelled', finished_at = ${d.now}, lease_until = NULL
WHERE id = ${id} AND state IN ('queued', 'running')
RETURNING id`;
