-- fencegate/lease: every job store gets its own identity (DESIGN §3, §6). PostgreSQL.
--
-- The default fence entity and every step's Idempotency-Key used to be built
-- from the job's integer id alone ('tool-job:<id>', 'tool-job:<id>:<step>').
-- Two job databases (or schemas) behind one gateway, or one database reset,
-- both have a job 1: the second one's charge was refused (422, another
-- payload under the same key), or got the first one's stored charge replayed
-- (the same payload), and its fence could be refused as stale. So each
-- schema gets a random id, created here with its tables, and every job
-- enqueued from now on carries it in its keys: 'tool-job:<store_id>:<id>'
-- and 'tool-job:<store_id>:<id>:<step>'.
--
-- One row: the store's identity, 32 lowercase hex characters (a UUID without
-- dashes, the same shape as on SQLite). Whoever copies a database must give
-- the copy a new one (docs/lease.md). Exactly 32: a short id such as '2'
-- would make 'tool-job:2:1:charge' equal job 2's old-format step '1:charge'.
CREATE TABLE IF NOT EXISTS tool_job_store (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  store_id  text    NOT NULL CHECK (store_id ~ '^[0-9a-f]{32}$')
);
INSERT INTO tool_job_store (singleton, store_id) VALUES (true, replace(gen_random_uuid()::text, '-', ''))
ON CONFLICT (singleton) DO NOTHING;

-- The identity each job's keys are built from, written once at enqueue and
-- never changed, so one job keeps one entity and one set of keys for its
-- whole life. NULL for jobs enqueued before this migration: they keep the
-- old format ('tool-job:<id>'), so a job that an older worker claimed before
-- the upgrade is fenced against the same entity after it.
ALTER TABLE tool_jobs ADD COLUMN IF NOT EXISTS store_id text;
