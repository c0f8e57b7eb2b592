-- fencegate/lease: the worker-side job table (DESIGN §4 seed schema, §6). PostgreSQL.
-- Times are timestamptz from the database clock (now()), never from a client (G6).

CREATE TABLE IF NOT EXISTS tool_jobs (
  -- An identity is never reused: the default fence entity is 'tool-job:<id>',
  -- and a reused id would start its tokens below the gateway's fence for it.
  id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind              text        NOT NULL,
  state             text        NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  owner_id          text,
  lease_until       timestamptz,
  -- Bumped by every claim; the X-Execution-Fence the gateway checks.
  fencing_token     bigint      NOT NULL DEFAULT 0,
  heartbeat_at      timestamptz,
  attempt           integer     NOT NULL DEFAULT 0,
  max_attempts      integer     NOT NULL CHECK (max_attempts >= 1),
  idempotency_key   text        NOT NULL UNIQUE,
  -- The fence entity; NULL means the default 'tool-job:<id>'.
  fence_key         text,
  payload           jsonb       NOT NULL,
  -- sha256 of the payload as enqueued: events and logs carry this, never the payload.
  payload_sha256    text        NOT NULL,
  result            jsonb,
  -- The last attempt's error {code, message, attempt}.
  error             jsonb,
  -- Why the job is in a terminal state: max_attempts, deadline, cancelled or an error code.
  reason            text,
  -- The owner whose expired lease this claim took over (NULL for a fresh claim).
  previous_owner_id text,
  created_at        timestamptz NOT NULL DEFAULT now(),
  first_claimed_at  timestamptz,
  deadline_at       timestamptz,
  -- A queued job is claimable from run_after on (retry backoff).
  run_after         timestamptz NOT NULL DEFAULT now(),
  finished_at       timestamptz
);

-- claim looks only at these two partial indexes, so finished rows, however
-- many, are never walked past: the seed's primary-key-only claim cost grew
-- linearly with them.
CREATE INDEX IF NOT EXISTS tool_jobs_queued  ON tool_jobs (run_after, id) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS tool_jobs_running ON tool_jobs (lease_until)   WHERE state = 'running';
-- claim keeps tokens monotonic per custom fence key across jobs (max over the key).
CREATE INDEX IF NOT EXISTS tool_jobs_fence_key ON tool_jobs (fence_key, fencing_token) WHERE fence_key IS NOT NULL;
