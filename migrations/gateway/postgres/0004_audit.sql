-- fencegate audit tables (issue 5). PostgreSQL; the same shape as
-- migrations/sqlite/0004_audit.sql. Times are timestamptz from now().

ALTER TABLE rejections ADD COLUMN IF NOT EXISTS detail text;

CREATE INDEX IF NOT EXISTS rejections_caller ON rejections (caller, id);

-- Every fence value ever accepted for an entity, written in the admission
-- transaction when the fence rises: one INSERT … ON CONFLICT DO NOTHING.
CREATE TABLE IF NOT EXISTS fence_history (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  entity      text        NOT NULL,
  fence       bigint      NOT NULL,
  at          timestamptz NOT NULL,
  caller      text,
  request_id  text,
  UNIQUE (entity, fence)
);

CREATE INDEX IF NOT EXISTS idempotency_records_unknown
  ON idempotency_records (created_at) WHERE state = 'outcome_unknown';

CREATE TABLE IF NOT EXISTS operator_actions (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at           timestamptz NOT NULL,
  action       text        NOT NULL CHECK (action IN ('resolve-completed', 'resolve-released')),
  scope        text        NOT NULL,
  key          text        NOT NULL,
  entity       text,
  fence        bigint,
  fingerprint  text,
  status       integer,
  operator     text,
  note         text,
  request_id   text
);
