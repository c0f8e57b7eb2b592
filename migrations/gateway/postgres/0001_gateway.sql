-- fencegate gateway tables (DESIGN §4). PostgreSQL.
-- Times are timestamptz from the database clock (now()), never from a client (G6).

CREATE TABLE IF NOT EXISTS fence_entities (
  entity          text        PRIMARY KEY,
  -- NULL until a request with a fence is admitted (serial mode without fences
  -- still needs the row for the in-flight slot).
  fence           bigint,
  accepted_at     timestamptz NOT NULL,
  inflight_owner  text,
  inflight_until  timestamptz
);

CREATE TABLE IF NOT EXISTS idempotency_records (
  scope        text        NOT NULL,
  key          text        NOT NULL,
  fingerprint  text        NOT NULL,
  entity       text,
  fence        bigint,
  state        text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'outcome_unknown')),
  owner_token  text        NOT NULL,
  locked_until timestamptz,
  status       integer,
  headers      jsonb,
  body         bytea,
  created_at   timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  PRIMARY KEY (scope, key)
);

CREATE INDEX IF NOT EXISTS idempotency_records_expiry
  ON idempotency_records (expires_at) WHERE state = 'completed';
CREATE INDEX IF NOT EXISTS idempotency_records_locked
  ON idempotency_records (locked_until) WHERE state = 'in_progress';
CREATE INDEX IF NOT EXISTS idempotency_records_by_key
  ON idempotency_records (key);

CREATE TABLE IF NOT EXISTS rejections (
  id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at               timestamptz NOT NULL,
  reason           text        NOT NULL,
  entity           text,
  presented_fence  bigint,
  current_fence    bigint,
  idempotency_key  text,
  caller           text,
  method           text,
  path             text,
  payload_sha256   text,
  request_id       text
);

CREATE INDEX IF NOT EXISTS rejections_at ON rejections (at);
CREATE INDEX IF NOT EXISTS rejections_entity ON rejections (entity, id);
CREATE INDEX IF NOT EXISTS rejections_reason ON rejections (reason, id);
