-- fencegate/queue: fences for jobs of someone else's queue (docs/queues.md). PostgreSQL.
--
-- One row per (queue, job): the last fence handed out. Every attempt of the
-- job, a take-over included, raises it by one in a single upsert, so the
-- newer attempt always holds the higher fence (DESIGN §1, §6.1). The queue's
-- own attempt counter is not used: graphile-worker's `attempts` is reset to
-- 0 by add_job (job_key_mode 'replace') and by reschedule_jobs.
CREATE TABLE IF NOT EXISTS fencegate_queue_fences (
  queue      text        NOT NULL,
  job_ref    text        NOT NULL,
  fence      bigint      NOT NULL CHECK (fence > 0),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue, job_ref)
);

-- The store's identity, in every entity and Idempotency-Key it builds
-- ('queue-job:<store_id>:<queue>:<job>'), so two databases (or schemas)
-- behind one gateway never share one. 32 lowercase hex characters, as the
-- lease module's tool_job_store. A copied database needs a new one.
CREATE TABLE IF NOT EXISTS fencegate_queue_store (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  store_id  text    NOT NULL CHECK (store_id ~ '^[0-9a-f]{32}$')
);
INSERT INTO fencegate_queue_store (singleton, store_id) VALUES (true, replace(gen_random_uuid()::text, '-', ''))
ON CONFLICT (singleton) DO NOTHING;
