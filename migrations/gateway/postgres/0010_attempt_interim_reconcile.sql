-- fencegate gateway, PostgreSQL: what a record keeps of its last attempt and
-- of the reconciler's last answer (DESIGN §3.12, §4.1). An interim answer of
-- an outcome_unknown record (DESIGN §3.7) lives in the existing status,
-- headers and body columns: no column for it. Tables only: the functions
-- that write these columns are in src/store/postgres/sql/ (DESIGN §4.5).

-- The lock end of the attempt last sent: written with every lock (admission,
-- takeover, extend), kept when the record becomes outcome_unknown. NULL for
-- rows written before this migration.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS attempt_until timestamptz;
-- The gateway's request id of the attempt last sent (a `{request_id}` in a
-- reconcile path names it). NULL for rows written before this migration.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS request_id text;
-- The reconciler's last answer that settled nothing (found / not-found /
-- not-yet-trusted / unknown / error) and when it came (database clock).
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS reconcile_result text;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS reconciled_at timestamptz;
