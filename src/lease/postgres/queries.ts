/**
 * The `tool_jobs` statements for PostgreSQL, one per operation. Each is a
 * single statement, so it is its own transaction. Time is the database's.
 *
 * Which clock. `now()` is the start of the transaction, here the moment the
 * statement arrived; a statement that then waited for a lock (a table lock,
 * a row another transaction was updating) would count its expiries from
 * before the wait, and judge leases by a time already past. So every expiry
 * written (`lease_until`, `run_after`, `deadline_at`) and every ownership or
 * deadline check uses `clock_timestamp()`, read when the row is computed
 * (and again when PostgreSQL re-checks a row that changed while it waited).
 * Records of when something happened (`created_at`, `heartbeat_at`,
 * `first_claimed_at`, `finished_at`) keep `now()`, one value per statement.
 * The claim's picks (`lease_until <= now()`, `run_after <= now()`) keep
 * `now()` too: they are index conditions, which a volatile function cannot
 * be, and an earlier time only makes fewer jobs look expired or ready.
 *
 * One case stays: a row locked without being changed (another transaction's
 * `SELECT … FOR UPDATE`) is waited for after the new row was computed, so
 * that lease end still counts from before the wait. It is shorter, never
 * longer, and the worker's own deadline counts from before it sent the
 * statement, so this costs lease time, not safety (docs/lease.md).
 */

import { cancelSql, completeSql, extendSql, failSql, releaseSql, type OwnedSqlDialect } from '../store-sql.js';

/** The clock of every write and every ownership check (see above). */
const CLOCK = 'clock_timestamp()';

const COLUMN_NAMES = [
  'id',
  'kind',
  'state',
  'owner_id',
  'lease_until',
  'fencing_token',
  'heartbeat_at',
  'attempt',
  'max_attempts',
  'idempotency_key',
  'job_key',
  'fence_key',
  'payload',
  'payload_sha256',
  'result',
  'error',
  'reason',
  'previous_owner_id',
  'created_at',
  'first_claimed_at',
  'deadline_at',
  'run_after',
  'finished_at',
];

/**
 * The job's key: `tool-job:<store_id>:<id>`, the default fence entity and the
 * base of every step's Idempotency-Key. A job enqueued before migration 0007
 * has no store_id and keeps the old `tool-job:<id>` (docs/lease.md).
 */
const jobKey = (t: string) => `'tool-job:' || coalesce(${t}store_id || ':', '') || ${t}id`;

/** Every column (optionally qualified), shaped for `rowToJob`; NULL fence_key reads as the default entity. */
const columns = (t: string) =>
  COLUMN_NAMES.map((n) =>
    n === 'job_key' ? `${jobKey(t)} AS job_key` : n === 'fence_key' ? `coalesce(${t}fence_key, ${jobKey(t)}) AS fence_key` : `${t}${n}`,
  ).join(', ');

export const JOB_COLUMNS = columns('');

/** The store's identity (migration 0007). */
export const STORE_ID = 'SELECT store_id FROM tool_job_store';

/**
 * $1 kind, $2 idempotency_key, $3 payload (JSON text), $4 payload_sha256,
 * $5 max_attempts, $6 deadline ms (NULL: none), $7 fence_key (NULL: the job
 * key), $8 store_id (the store's identity, fixed in the row for the job's
 * whole life). A known key inserts nothing and returns nothing; the store
 * then reads it.
 */
export const ENQUEUE = `
INSERT INTO tool_jobs (kind, idempotency_key, payload, payload_sha256, max_attempts, deadline_at, fence_key, store_id,
                       created_at, run_after)
VALUES ($1, $2, $3::jsonb, $4, $5, ${CLOCK} + $6::bigint * interval '1 millisecond', $7, $8, now(), ${CLOCK})
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING ${JOB_COLUMNS}`;

export const BY_KEY = `SELECT ${JOB_COLUMNS} FROM tool_jobs WHERE idempotency_key = $1`;
export const BY_ID = `SELECT ${JOB_COLUMNS} FROM tool_jobs WHERE id = $1`;

/** $2: kinds (text[]), or NULL for any kind. */
const KIND_FILTER = '($2::text[] IS NULL OR kind = ANY ($2::text[]))';

/**
 * Why a picked job may not be handed out (NULL: it may). Computed in the
 * locking SELECTs below: `FOR UPDATE` returns (and re-checks) the newest
 * version of the row, so these values are those of the row we locked.
 */
const PICKED = `id, owner_id, kind,
  CASE WHEN deadline_at <= ${CLOCK} THEN 'deadline'
       WHEN attempt >= max_attempts THEN 'max_attempts' END AS dead`;

/**
 * The UPDATE of both claim statements, over the picked rows `p`: a live job
 * becomes `running` under its new owner (`$1`) with the next token and a
 * fresh lease (`$3`, `$4`), a dead one `failed` with its reason. `step` is
 * what the token rises by above both this job's token and the highest token
 * under its custom fence key.
 */
const claimUpdate = (step: string) => `UPDATE tool_jobs j SET
  state = CASE WHEN p.dead IS NULL THEN 'running' ELSE 'failed' END,
  reason = p.dead,
  finished_at = CASE WHEN p.dead IS NULL THEN NULL ELSE now() END,
  previous_owner_id = CASE WHEN p.was_running THEN p.previous_owner END,
  owner_id = CASE WHEN p.dead IS NULL THEN $1 ELSE j.owner_id END,
  fencing_token = CASE WHEN p.dead IS NULL
    THEN ${step}
       + greatest(j.fencing_token, coalesce((SELECT max(o.fencing_token) FROM tool_jobs o
                                             WHERE o.fence_key IS NOT NULL AND o.fence_key = j.fence_key), 0))
    ELSE j.fencing_token END,
  attempt = CASE WHEN p.dead IS NULL THEN j.attempt + 1 ELSE j.attempt END,
  lease_until = CASE WHEN p.dead IS NULL
    THEN ${CLOCK} + coalesce(($4::jsonb ->> p.kind)::bigint, $3::bigint) * interval '1 millisecond'
    ELSE j.lease_until END,
  heartbeat_at = CASE WHEN p.dead IS NULL THEN now() ELSE j.heartbeat_at END,
  first_claimed_at = coalesce(j.first_claimed_at, CASE WHEN p.dead IS NULL THEN now() END)
`;

/**
 * $1 owner, $2 kinds (text[] or NULL), $3 default lease ms, $4 lease ms by
 * kind (jsonb object). Picks an expired running job first (recovery), else
 * the oldest ready queued one, each through its partial index and with
 * `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on or take the
 * same row, and finished rows are never read. The second CTE is only scanned
 * when the first is empty (UNION ALL … LIMIT 1 stops early), so at most one
 * row is locked. A job whose attempts are used up or whose deadline passed
 * becomes `failed` with the reason instead (the returned state says which).
 *
 * The token: one more than both this job's token and the highest token under
 * its custom fence key, so tokens stay monotonic per fence entity when jobs
 * share a key one after the other.
 */
export const CLAIM = `
WITH expired AS (
  SELECT ${PICKED} FROM tool_jobs
   WHERE state = 'running' AND lease_until <= now() AND ${KIND_FILTER}
   ORDER BY lease_until
   LIMIT 1
   FOR UPDATE SKIP LOCKED
), ready AS (
  SELECT ${PICKED} FROM tool_jobs
   WHERE state = 'queued' AND run_after <= now() AND ${KIND_FILTER}
   ORDER BY run_after, id
   LIMIT 1
   FOR UPDATE SKIP LOCKED
), pick AS (
  SELECT id, owner_id AS previous_owner, kind, dead, true AS was_running FROM expired
  UNION ALL
  SELECT id, NULL, kind, dead, false FROM ready
  LIMIT 1
)
${claimUpdate('1')}FROM pick p
WHERE j.id = p.id
RETURNING ${columns('j.')}`;

/**
 * CLAIM_MANY's CTEs (expired, ready, pick, ranked) for up to `limit` jobs,
 * written once for CLAIM_MANY and COMPLETE_CLAIM_MANY: the same picks, locks
 * and ranks, so the rules of a claim live in one place.
 */
function claimManyPicks(limit: string): string {
  return `expired AS (
  SELECT ${PICKED}, fence_key FROM tool_jobs
   WHERE state = 'running' AND lease_until <= now() AND ${KIND_FILTER}
   ORDER BY lease_until
   LIMIT ${limit}
   FOR UPDATE SKIP LOCKED
), ready AS (
  SELECT ${PICKED}, fence_key FROM tool_jobs
   WHERE state = 'queued' AND run_after <= now() AND ${KIND_FILTER}
   ORDER BY run_after, id
   LIMIT ${limit}
   FOR UPDATE SKIP LOCKED
), pick AS (
  SELECT id, owner_id AS previous_owner, kind, dead, fence_key, true AS was_running FROM expired
  UNION ALL
  SELECT id, NULL, kind, dead, fence_key, false FROM ready
  LIMIT ${limit}
), ranked AS (
  SELECT pick.*, row_number() OVER (PARTITION BY fence_key ORDER BY id) AS nth FROM pick
)`;
}

/** CLAIM_MANY's UPDATE of the ranked picks (its RETURNING follows). */
const claimManyUpdate = `${claimUpdate('CASE WHEN j.fence_key IS NULL THEN 1 ELSE p.nth END')}FROM ranked p
WHERE j.id = p.id
  AND j.id = ANY (ARRAY(SELECT id FROM pick))`;

/**
 * CLAIM for up to $5 callers at once (the store groups claim() calls that
 * arrive while one is in flight: docs/bench-lease.md). $1–$4 as in CLAIM.
 * The same picks, locks and ownership columns, row by row: expired running
 * jobs first, then the oldest ready ones, each `FOR UPDATE SKIP LOCKED`, and
 * the second CTE is read only for the rows the first did not supply.
 *
 * Tokens: as in CLAIM, plus the job's rank among the picked jobs that share
 * its custom fence key, so two jobs of one key claimed together get distinct,
 * rising tokens, as two claims one after the other would.
 *
 * `j.id = ANY (ARRAY(SELECT id FROM pick))` repeats the join as an index
 * condition on purpose. The statement is prepared, and once PostgreSQL
 * switches to its generic plan, `LIMIT $5` is an unknown number of rows
 * (it assumes a tenth of the table): with 20,000 rows it hash-joined the picks
 * against a sequential scan of the whole table, 16 ms a claim instead of 0.4
 * (the lease benchmark's "empty" row was slower than its history row). With
 * the array the primary key is read for the picked ids only, whatever the
 * estimate (test/lease/group.postgres.test.ts checks the generic plan).
 */
export const CLAIM_MANY = `
WITH ${claimManyPicks('$5')}
${claimManyUpdate}
RETURNING ${columns('j.')}`;

/** PostgreSQL's words for the statements of ../store-sql.ts; ownership params $1 id, $2 owner, $3 token. */
const WORDS: OwnedSqlDialect = {
  owned: `id = $1 AND owner_id = $2 AND fencing_token = $3 AND state = 'running' AND lease_until > ${CLOCK}`,
  now: 'now()',
  clock: CLOCK,
  later: (ms) => `${CLOCK} + ${ms}::bigint * interval '1 millisecond'`,
};

/** $1 id, $2 owner, $3 token, $4 lease ms. Zero rows: the lease is lost. */
export const EXTEND = extendSql(WORDS, '$4');

/** $1 id, $2 owner, $3 token, $4 result (JSON text). Zero rows: the lease is lost, nothing stored. */
export const COMPLETE = completeSql(WORDS, '$4::jsonb');

/**
 * COMPLETE for several leases in one statement, its arrays at the given
 * placeholders: ids, owners, tokens, results (JSON texts), one element per
 * lease, no id twice. Each row is written only under the full ownership
 * condition of COMPLETE; the ids returned are the leases that were still
 * held, the others are lost.
 */
const completeMany = (
  ids: string,
  owners: string,
  tokens: string,
  results: string,
) => `UPDATE tool_jobs j SET state = 'succeeded', result = x.result, finished_at = now(), lease_until = NULL
FROM unnest(${ids}::bigint[], ${owners}::text[], ${tokens}::bigint[], ${results}::jsonb[]) AS x(id, owner_id, fencing_token, result)
WHERE j.id = x.id AND j.owner_id = x.owner_id AND j.fencing_token = x.fencing_token
  AND j.state = 'running' AND j.lease_until > ${CLOCK}
RETURNING j.id`;

/**
 * The store groups complete() calls that arrive while one is in flight:
 * $1 ids, $2 owners, $3 tokens, $4 results (see completeMany).
 */
export const COMPLETE_MANY = `
${completeMany('$1', '$2', '$3', '$4')}`;

/**
 * COMPLETE_MANY, then CLAIM_MANY for as many jobs as it completed plus $9,
 * in one statement: one round trip, one commit and one WAL flush where a
 * worker's finished slots would pay two (docs/bench-lease.md). $1–$4 as in
 * CLAIM; $5–$8 the leases and results, as COMPLETE_MANY's $1–$4; $9 the
 * plain claims of the group (./claim.ts), which need no complete.
 *
 * The claim is CLAIM_MANY's own text (claimManyPicks, claimManyUpdate), with
 * `LIMIT (SELECT count(*) FROM done) + $9`: a lease whose complete was
 * refused (stale token, lost, expired) adds no claim, so a stale completer
 * claims nothing on its own behalf. Every sub-statement reads the snapshot
 * of the statement's start, so the picks see the just-completed jobs as
 * running under a live lease (`done` checked `lease_until >
 * clock_timestamp()`), which neither pick takes: a job is never completed
 * and claimed in one go.
 *
 * One row always: `done`, the ids completed, and the claimed job's columns,
 * NULL when nothing was claimed.
 */
export const COMPLETE_CLAIM_MANY = `
WITH done AS (
${completeMany('$5', '$6', '$7', '$8')}
), ${claimManyPicks('((SELECT count(*) FROM done) + $9::int)')}, claimed AS (
${claimManyUpdate}
RETURNING ${columns('j.')}
)
SELECT d.done, c.* FROM (SELECT array_agg(id) AS done FROM done) d LEFT JOIN claimed c ON true`;

/**
 * $1 id, $2 owner, $3 token, $4 error (JSON text), $5 retryable, $6 backoff
 * ms, $7 error code. Requeues or ends the job (../store-sql.ts).
 */
export const FAIL = failSql(WORDS, {
  retryable: '$5::boolean',
  backoffMs: '$6',
  errorCode: '$7::text',
  errorWithAttempt: "jsonb_set($4::jsonb, '{attempt}', to_jsonb(attempt))",
});

/** $1 id, $2 owner, $3 token. Back to the queue at once; the attempt still counts. */
export const RELEASE = releaseSql(WORDS);

/** $1 id. */
export const CANCEL = cancelSql(WORDS, '$1');

export const COUNTS = 'SELECT state, kind, count(*)::int AS count FROM tool_jobs GROUP BY state, kind ORDER BY state, kind';
