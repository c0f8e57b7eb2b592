-- fencegate gateway tables (DESIGN §4). SQLite and D1.
-- Times are integer milliseconds since the Unix epoch, always taken from the
-- database clock (unixepoch('subsec')), never from a client (G6).
-- Fences are 64-bit integers (0 … 2^63-1), which SQLite's INTEGER holds exactly.

CREATE TABLE IF NOT EXISTS fence_entities (
  entity          TEXT    PRIMARY KEY NOT NULL,
  -- NULL until a request with a fence is admitted (serial mode without fences
  -- still needs the row for the in-flight slot).
  fence           INTEGER,
  accepted_at     INTEGER NOT NULL,
  -- serial mode: the owner token of the one request in flight upstream, and
  -- when that slot expires if its gateway died.
  inflight_owner  TEXT,
  inflight_until  INTEGER
) STRICT;

CREATE TABLE IF NOT EXISTS idempotency_records (
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
  expires_at   INTEGER NOT NULL,
  PRIMARY KEY (scope, key)
) STRICT;

-- The sweeper's two scans: expired completed records, and in_progress
-- records whose lock ran out (their gateway died: they become outcome_unknown).
CREATE INDEX IF NOT EXISTS idempotency_records_expiry
  ON idempotency_records (expires_at) WHERE state = 'completed';
CREATE INDEX IF NOT EXISTS idempotency_records_locked
  ON idempotency_records (locked_until) WHERE state = 'in_progress';
CREATE INDEX IF NOT EXISTS idempotency_records_by_key
  ON idempotency_records (key);

-- The rejection log: ids, tokens and hashes, never bodies.
CREATE TABLE IF NOT EXISTS rejections (
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
) STRICT;

CREATE INDEX IF NOT EXISTS rejections_at ON rejections (at);
CREATE INDEX IF NOT EXISTS rejections_entity ON rejections (entity, id);
CREATE INDEX IF NOT EXISTS rejections_reason ON rejections (reason, id);
