-- fencegate audit tables (issue 5). SQLite and D1.
-- Times are integer milliseconds from the database clock, as in 0001.

-- Why a refusal happened, in words an auditor can use ("expired",
-- "wrong audience", "missing scope fencegate:proxy", …). Never a token or a
-- body: at most the first 16 hex digits of a token's sha256.
ALTER TABLE rejections ADD COLUMN detail TEXT;

-- Rejections by caller, newest first (the audit API's caller filter).
CREATE INDEX IF NOT EXISTS rejections_caller ON rejections (caller, id);

-- Every fence value ever accepted for an entity, written in the admission
-- transaction when the fence rises (and when it is first set). Fences only
-- rise, so (entity, fence) names one rise, and the insert is one
-- `ON CONFLICT DO NOTHING` statement that needs no read. Append-only.
CREATE TABLE IF NOT EXISTS fence_history (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  entity      TEXT    NOT NULL,
  fence       INTEGER NOT NULL,
  at          INTEGER NOT NULL,
  -- The authenticated caller and the request that presented the fence.
  caller      TEXT,
  request_id  TEXT,
  UNIQUE (entity, fence)
) STRICT;

-- Records waiting for an operator (the console lists them, newest first).
CREATE INDEX IF NOT EXISTS idempotency_records_unknown
  ON idempotency_records (created_at) WHERE state = 'outcome_unknown';

-- What operators did: settling an outcome_unknown record as completed (with
-- the response they confirmed with the upstream) or released. Append-only.
CREATE TABLE IF NOT EXISTS operator_actions (
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
