/**
 * The `tool_jobs` statements for SQLite, one per operation. Every write runs
 * inside `BEGIN IMMEDIATE` (the caller's job), so a statement never has to
 * upgrade a read lock to a write lock while another process writes.
 *
 * Time is always the database's: `NOW` is evaluated by SQLite and is the same
 * for the whole statement (one sqlite3_step).
 */

import { cancelSql, completeSql, extendSql, failSql, releaseSql, type OwnedSqlDialect } from '../store-sql.js';

/** Integer milliseconds from the database clock. */
const NOW = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/**
 * The job's key: `tool-job:<store_id>:<id>`, the default fence entity and the
 * base of every step's Idempotency-Key. A job enqueued before migration 0007
 * has no store_id and keeps the old `tool-job:<id>` (docs/lease.md).
 */
const JOB_KEY = "'tool-job:' || coalesce(store_id || ':', '') || id";

/** Every column, shaped for `rowToJob`; a NULL fence_key reads as the default entity. */
export const JOB_COLUMNS = `id, kind, state, owner_id, lease_until, fencing_token, heartbeat_at, attempt,
  max_attempts, idempotency_key, ${JOB_KEY} AS job_key, coalesce(fence_key, ${JOB_KEY}) AS fence_key, payload,
  payload_sha256, result, error, reason, previous_owner_id, created_at, first_claimed_at,
  deadline_at, run_after, finished_at`;

/** The store's identity (migration 0007). */
export const STORE_ID = 'SELECT store_id FROM tool_job_store';

/**
 * Params: kind, idempotency_key, payload, payload_sha256, max_attempts,
 * deadline_ms (NULL: none), fence_key (NULL: the job key), store_id (the
 * store's identity, fixed in the row for the job's whole life).
 * A known key inserts nothing and returns nothing; the store then reads it.
 */
export const ENQUEUE = `
INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts,
                       deadline_at, fence_key, store_id, created_at, run_after)
VALUES (?, ?, ?, ?, ?, ${NOW} + ?, ?, ?, ${NOW}, ${NOW})
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING ${JOB_COLUMNS}`;

export const BY_KEY = `SELECT ${JOB_COLUMNS} FROM tool_jobs WHERE idempotency_key = ?`;
export const BY_ID = `SELECT ${JOB_COLUMNS} FROM tool_jobs WHERE id = ?`;

/** Why a picked job may not be handed out (NULL: it may). Old-row values, as in every SET. */
const DEAD = `CASE WHEN deadline_at <= ${NOW} THEN 'deadline'
                   WHEN attempt >= max_attempts THEN 'max_attempts' END`;

/** `:kinds` is a JSON array of kinds, or NULL for any kind. */
const KIND_FILTER = '(:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))';

/**
 * Named params: owner, kinds, lease_default_ms, lease_by_kind (JSON object
 * kind → ms). Picks an expired running job first (recovery), else the oldest
 * ready queued one; each through its partial index, so finished rows are
 * never read. A job whose attempts are used up or whose deadline passed
 * becomes `failed` with the reason instead (the returned state says which).
 *
 * The token: one more than both this job's token and the highest token under
 * its custom fence key, so tokens stay monotonic per fence entity even when
 * several jobs (one after the other) share a key.
 */
export const CLAIM = `
UPDATE tool_jobs SET
  state = CASE WHEN ${DEAD} IS NULL THEN 'running' ELSE 'failed' END,
  reason = ${DEAD},
  finished_at = CASE WHEN ${DEAD} IS NULL THEN NULL ELSE ${NOW} END,
  previous_owner_id = CASE WHEN state = 'running' THEN owner_id END,
  owner_id = CASE WHEN ${DEAD} IS NULL THEN :owner ELSE owner_id END,
  fencing_token = CASE WHEN ${DEAD} IS NULL
    THEN 1 + max(fencing_token, coalesce((SELECT max(o.fencing_token) FROM tool_jobs o
                                          WHERE o.fence_key IS NOT NULL AND o.fence_key = tool_jobs.fence_key), 0))
    ELSE fencing_token END,
  attempt = CASE WHEN ${DEAD} IS NULL THEN attempt + 1 ELSE attempt END,
  lease_until = CASE WHEN ${DEAD} IS NULL
    THEN ${NOW} + coalesce((SELECT value FROM json_each(:lease_by_kind) WHERE key = kind), :lease_default_ms)
    ELSE lease_until END,
  heartbeat_at = CASE WHEN ${DEAD} IS NULL THEN ${NOW} ELSE heartbeat_at END,
  first_claimed_at = coalesce(first_claimed_at, CASE WHEN ${DEAD} IS NULL THEN ${NOW} END)
WHERE id = coalesce(
  (SELECT id FROM tool_jobs
    WHERE state = 'running' AND lease_until <= ${NOW} AND ${KIND_FILTER}
    ORDER BY lease_until LIMIT 1),
  (SELECT id FROM tool_jobs
    WHERE state = 'queued' AND run_after <= ${NOW} AND ${KIND_FILTER}
    ORDER BY run_after, id LIMIT 1))
RETURNING ${JOB_COLUMNS}`;

/** SQLite's words for the statements of ../store-sql.ts; ownership named params id, owner, token. */
const WORDS: OwnedSqlDialect = {
  owned: `id = :id AND owner_id = :owner AND fencing_token = :token
  AND state = 'running' AND lease_until > ${NOW}`,
  now: NOW,
  clock: NOW,
  later: (ms) => `${NOW} + ${ms}`,
};

/** Params: id, owner, token, lease_ms. Zero rows: the lease is lost. */
export const EXTEND = extendSql(WORDS, ':lease_ms');

/** Params: id, owner, token, result (JSON). Zero rows: the lease is lost, nothing stored. */
export const COMPLETE = completeSql(WORDS, ':result');

/**
 * Params: id, owner, token, error (JSON), error_code, retryable (0/1),
 * backoff_ms. Requeues or ends the job (../store-sql.ts).
 */
export const FAIL = failSql(WORDS, {
  retryable: ':retryable',
  backoffMs: ':backoff_ms',
  errorCode: ':error_code',
  errorWithAttempt: "json_set(:error, '$.attempt', attempt)",
});

/** Params: id, owner, token. Back to the queue at once; the attempt still counts. */
export const RELEASE = releaseSql(WORDS);

/** Param: id. */
export const CANCEL = cancelSql(WORDS, '?');

export const COUNTS = 'SELECT state, kind, count(*) AS count FROM tool_jobs GROUP BY state, kind ORDER BY state, kind';
