-- fencegate/queue: fences for jobs of someone else's queue (docs/queues.md). SQLite.
--
-- One row per (queue, job): the last fence handed out. Every attempt of the
-- job, a take-over included, raises it by one in a single upsert, so the
-- newer attempt always holds the higher fence (DESIGN §1, §6.1).
CREATE TABLE IF NOT EXISTS fencegate_queue_fences (
  queue      TEXT    NOT NULL,
  job_ref    TEXT    NOT NULL,
  fence      INTEGER NOT NULL CHECK (fence > 0),
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (queue, job_ref)
) STRICT;

-- The store's identity, in every entity and Idempotency-Key it builds
-- ('queue-job:<store_id>:<queue>:<job>'), so two databases behind one
-- gateway never share one. A copied database file needs a new one.
CREATE TABLE IF NOT EXISTS fencegate_queue_store (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT    NOT NULL CHECK (length(store_id) = 32 AND store_id NOT GLOB '*[^0-9a-f]*')
) STRICT;
INSERT OR IGNORE INTO fencegate_queue_store (singleton, store_id) VALUES (1, lower(hex(randomblob(16))));
