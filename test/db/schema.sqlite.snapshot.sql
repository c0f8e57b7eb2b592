-- fencegate: the whole current SQLite schema of a freshly migrated database.
-- Generated from migrations/gateway/sqlite and migrations/lease/sqlite; do not edit.
-- Compared by test/db/schema-snapshot.test.ts; after a deliberate change: UPDATE_SNAPSHOTS=1 npx vitest run test/db/schema-snapshot.test.ts

-- ===== gateway database (migrations/gateway/sqlite; D1 too) =====

CREATE TABLE admission_scratch (
  id               TEXT    PRIMARY KEY NOT NULL,
  -- The database clock, read once per batch (G6): every expiry test of the
  -- batch compares against this one value, as the SQLite store does.
  now              INTEGER NOT NULL,
  -- NULL while the admission goes on; then 'stale-fence', 'replay',
  -- 'idempotency-key-reused', 'idempotency-in-progress', 'outcome-unknown'
  -- or 'entity-busy'. Still NULL at the end means forward.
  decision         TEXT,
  current_fence    INTEGER,
  -- The idempotency record as it was seen, after the expired-completed delete.
  rec_state        TEXT,
  rec_fingerprint  TEXT,
  rec_owner        TEXT,
  rec_locked_until INTEGER,
  -- 1: the record was in_progress with an expired lock (its gateway died).
  mark_unknown     INTEGER NOT NULL DEFAULT 0,
  -- onUnknown: retry takes over the record held by this owner token.
  takeover_from    TEXT,
  -- Retry-After source: the record lock or the serial slot that blocks us.
  busy_until       INTEGER
) STRICT;

CREATE TABLE commands (
  id                 INTEGER PRIMARY KEY AUTOINCREMENT,
  at                 INTEGER NOT NULL,
  route              TEXT,
  method             TEXT,
  path               TEXT,
  entity             TEXT,
  fence              INTEGER,
  idempotency_key    TEXT,
  scope              TEXT,
  caller             TEXT,
  tool               TEXT,
  outcome            TEXT    NOT NULL,
  decision           TEXT,
  status             INTEGER,
  upstream_ms        REAL,
  request_id         TEXT,
  client_request_id  TEXT,
  payload_sha256     TEXT
) STRICT;

CREATE INDEX commands_at ON commands (at);

CREATE INDEX commands_entity ON commands (entity, id);

CREATE INDEX commands_key ON commands (idempotency_key, id);

CREATE TABLE "fence_entities" (
  entity          TEXT    PRIMARY KEY NOT NULL,
  fence           INTEGER,
  accepted_at     INTEGER NOT NULL,
  inflight_owner  TEXT,
  inflight_until  INTEGER
) STRICT, WITHOUT ROWID;

CREATE INDEX fence_entities_accepted ON fence_entities (accepted_at);

CREATE TABLE "fence_history" (
  entity      TEXT    NOT NULL,
  fence       INTEGER NOT NULL,
  at          INTEGER NOT NULL,
  caller      TEXT,
  request_id  TEXT,
  PRIMARY KEY (entity, fence)
) STRICT, WITHOUT ROWID;

CREATE INDEX fence_history_at ON fence_history (at);

CREATE TABLE fencegate_migrations (
      name TEXT PRIMARY KEY NOT NULL,
      applied_at INTEGER NOT NULL
    ) STRICT;

CREATE TABLE "idempotency_records" (
  scope        TEXT    NOT NULL,
  key          TEXT    NOT NULL,
  fingerprint  TEXT    NOT NULL,
  entity       TEXT,
  fence        INTEGER,
  state        TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed', 'outcome_unknown')),
  owner_token  TEXT    NOT NULL,
  locked_until INTEGER,
  status       INTEGER,
  headers      TEXT,
  body         BLOB,
  created_at   INTEGER NOT NULL,
  expires_at   INTEGER NOT NULL, attempt_until INTEGER, request_id TEXT, reconcile_result TEXT, reconciled_at INTEGER,
  PRIMARY KEY (key, scope)
) STRICT;

CREATE INDEX idempotency_records_expiry
  ON idempotency_records (expires_at) WHERE state = 'completed';

CREATE INDEX idempotency_records_locked
  ON idempotency_records (locked_until) WHERE state = 'in_progress';

CREATE INDEX idempotency_records_unknown
  ON idempotency_records (created_at) WHERE state = 'outcome_unknown';

CREATE TABLE operator_actions (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  at           INTEGER NOT NULL,
  action       TEXT    NOT NULL CHECK (action IN ('resolve-completed', 'resolve-released')),
  scope        TEXT    NOT NULL,
  key          TEXT    NOT NULL,
  entity       TEXT,
  fence        INTEGER,
  fingerprint  TEXT,
  -- completed: the status the operator confirmed; the body is stored on the record only.
  status       INTEGER,
  operator     TEXT,
  note         TEXT,
  request_id   TEXT
) STRICT;

CREATE INDEX operator_actions_at ON operator_actions (at);

CREATE TABLE rejections (
  id               INTEGER PRIMARY KEY AUTOINCREMENT,
  at               INTEGER NOT NULL,
  reason           TEXT    NOT NULL,
  entity           TEXT,
  presented_fence  INTEGER,
  current_fence    INTEGER,
  idempotency_key  TEXT,
  caller           TEXT,
  method           TEXT,
  path             TEXT,
  payload_sha256   TEXT,
  request_id       TEXT
, detail TEXT, client_request_id TEXT, tool TEXT) STRICT;

CREATE INDEX rejections_at ON rejections (at);

CREATE INDEX rejections_caller ON rejections (caller, id);

CREATE INDEX rejections_entity ON rejections (entity, id);

CREATE INDEX rejections_reason ON rejections (reason, id);

CREATE INDEX rejections_tool ON rejections (tool, id);

CREATE TABLE sqlite_sequence(name,seq);

-- ===== lease database (migrations/lease/sqlite) =====

CREATE TABLE fencegate_lease_migrations (
      name TEXT PRIMARY KEY NOT NULL,
      applied_at INTEGER NOT NULL
    ) STRICT;

CREATE TABLE sqlite_sequence(name,seq);

CREATE TABLE tool_job_store (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT    NOT NULL CHECK (length(store_id) = 32 AND store_id NOT GLOB '*[^0-9a-f]*')
) STRICT;

CREATE TABLE tool_jobs (
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
, store_id TEXT) STRICT;

CREATE INDEX tool_jobs_fence_key ON tool_jobs (fence_key, fencing_token) WHERE fence_key IS NOT NULL;

CREATE INDEX tool_jobs_queued  ON tool_jobs (run_after, id) WHERE state = 'queued';

CREATE INDEX tool_jobs_running ON tool_jobs (lease_until)   WHERE state = 'running';
