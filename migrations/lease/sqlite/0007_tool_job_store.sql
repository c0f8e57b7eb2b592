-- fencegate/lease: every job store gets its own identity (DESIGN §3, §6). SQLite and D1.
--
-- The default fence entity and every step's Idempotency-Key used to be built
-- from the job's integer id alone ('tool-job:<id>', 'tool-job:<id>:<step>').
-- Two job databases behind one gateway, or one database reset, both have a
-- job 1: the second one's charge was refused (422, another payload under the
-- same key), or got the first one's stored charge replayed (the same
-- payload), and its fence could be refused as stale. So each database gets a
-- random id, created here with its schema, and every job enqueued from now on
-- carries it in its keys: 'tool-job:<store_id>:<id>' and
-- 'tool-job:<store_id>:<id>:<step>'.
--
-- One row: the store's identity, exactly 32 lowercase hex characters. An
-- operator who copies a database file must give the copy a new one
-- (docs/lease.md). Exactly 32: a short id such as '2' would make the new
-- format 'tool-job:2:1:charge' equal the old format of job 2, step '1:charge'.
CREATE TABLE IF NOT EXISTS tool_job_store (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT    NOT NULL CHECK (length(store_id) = 32 AND store_id NOT GLOB '*[^0-9a-f]*')
) STRICT;
INSERT OR IGNORE INTO tool_job_store (singleton, store_id) VALUES (1, lower(hex(randomblob(16))));

-- The identity each job's keys are built from, written once at enqueue and
-- never changed, so one job keeps one entity and one set of keys for its
-- whole life. NULL for jobs enqueued before this migration: they keep the
-- old format ('tool-job:<id>'), so a job that an older worker claimed before
-- the upgrade is fenced against the same entity after it.
ALTER TABLE tool_jobs ADD COLUMN store_id TEXT;
