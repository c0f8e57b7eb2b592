-- fencegate gateway, SQLite and D1: what a record keeps of its last attempt
-- and of the reconciler's last answer (DESIGN §3.12, §4.1). An interim answer
-- of an outcome_unknown record (DESIGN §3.7) lives in the existing status,
-- headers and body columns: no column for it.

-- The lock end of the attempt last sent (ms, database clock): written with
-- every lock (admission, takeover, extendLock), kept when the record becomes
-- outcome_unknown. NULL for rows written before this migration.
ALTER TABLE idempotency_records ADD COLUMN attempt_until INTEGER;
-- The gateway's request id of the attempt last sent (a `{request_id}` in a
-- reconcile path names it). NULL for rows written before this migration.
ALTER TABLE idempotency_records ADD COLUMN request_id TEXT;
-- The reconciler's last answer that settled nothing (found / not-found /
-- not-yet-trusted / unknown / error) and when it came (ms, database clock).
ALTER TABLE idempotency_records ADD COLUMN reconcile_result TEXT;
ALTER TABLE idempotency_records ADD COLUMN reconciled_at INTEGER;
