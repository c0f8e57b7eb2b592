-- fencegate/lease: the worker-side job table (DESIGN §4 seed schema, §6). SQLite and D1.
-- Times are integer milliseconds since the Unix epoch from the database clock
-- (unixepoch('subsec')), never from a client (G6).

CREATE TABLE IF NOT EXISTS tool_jobs (
  -- AUTOINCREMENT: an id is never reused, even after rows are deleted, because
  -- the default fence entity is 'tool-job:<id>' and a reused id would start its
  -- fencing tokens below the fence the gateway already holds for that entity.
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  kind              TEXT    NOT NULL,
  state             TEXT    NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  owner_id          TEXT,
  lease_until       INTEGER,
  -- Bumped by every claim; the X-Execution-Fence the gateway checks.
  fencing_token     INTEGER NOT NULL DEFAULT 0,
  heartbeat_at      INTEGER,
  attempt           INTEGER NOT NULL DEFAULT 0,
  max_attempts      INTEGER NOT NULL CHECK (max_attempts >= 1),
  idempotency_key   TEXT    NOT NULL UNIQUE,
  -- The fence entity; NULL means the default 'tool-job:<id>'.
  fence_key         TEXT,
  payload           TEXT    NOT NULL,
  -- sha256 of the payload as enqueued: events and logs carry this, never the payload.
  payload_sha256    TEXT    NOT NULL,
  result            TEXT,
  -- The last attempt's error, JSON {code, message, attempt}.
  error             TEXT,
  -- Why the job is in a terminal state: max_attempts, deadline, cancelled or an error code.
  reason            TEXT,
  -- The owner whose expired lease this claim took over (NULL for a fresh claim).
  previous_owner_id TEXT,
  created_at        INTEGER NOT NULL,
  first_claimed_at  INTEGER,
  deadline_at       INTEGER,
  -- A queued job is claimable from run_after on (retry backoff).
  run_after         INTEGER NOT NULL,
  finished_at       INTEGER
) STRICT;

-- claim looks only at these two partial indexes, so finished rows, however
-- many, are never walked past: the seed's primary-key-only claim cost grew
-- linearly with them.
CREATE INDEX IF NOT EXISTS tool_jobs_queued  ON tool_jobs (run_after, id) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS tool_jobs_running ON tool_jobs (lease_until)   WHERE state = 'running';
-- claim keeps tokens monotonic per custom fence key across jobs (max over the key).
CREATE INDEX IF NOT EXISTS tool_jobs_fence_key ON tool_jobs (fence_key, fencing_token) WHERE fence_key IS NOT NULL;
