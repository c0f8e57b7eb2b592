-- fencegate: fewer B-tree pages written per decision (issue 6). SQLite and D1.
--
-- A commit writes every page it dirtied to the WAL (two write(2) calls per
-- page), and that, more than the SQL, was the store's cost per request: the
-- admission dirtied about ten pages. The same columns and constraints, laid
-- out so that each decision touches fewer B-trees:
--
-- - fence_entities: WITHOUT ROWID, keyed by entity. Its rows are small; the
--   table and its primary-key index were two B-trees, now one.
-- - fence_history: WITHOUT ROWID, keyed by (entity, fence), which was already
--   its unique key and its only access path. The AUTOINCREMENT id (a write to
--   sqlite_sequence on every rise) and the separate unique index are gone:
--   one B-tree instead of three. Fences only rise, so (entity, fence) still
--   names one rise, and the audit API pages it by fence.
-- - idempotency_records: primary key (key, scope) instead of (scope, key).
--   Lookups name both columns, so either order serves them; with key first,
--   the primary key also serves the lookup by key alone (the admin API and
--   the audit API), and the separate idempotency_records_by_key index goes.
--   It stays a rowid table: stored response bodies are often larger than a
--   WITHOUT ROWID row keeps on its own page.
--
-- Rebuilt tables are copied row for row, in one transaction (the migration's).

CREATE TABLE fence_entities_lean (
  entity          TEXT    PRIMARY KEY NOT NULL,
  fence           INTEGER,
  accepted_at     INTEGER NOT NULL,
  inflight_owner  TEXT,
  inflight_until  INTEGER
) STRICT, WITHOUT ROWID;
INSERT INTO fence_entities_lean (entity, fence, accepted_at, inflight_owner, inflight_until)
  SELECT entity, fence, accepted_at, inflight_owner, inflight_until FROM fence_entities;
DROP TABLE fence_entities;
ALTER TABLE fence_entities_lean RENAME TO fence_entities;

CREATE TABLE fence_history_lean (
  entity      TEXT    NOT NULL,
  fence       INTEGER NOT NULL,
  at          INTEGER NOT NULL,
  caller      TEXT,
  request_id  TEXT,
  PRIMARY KEY (entity, fence)
) STRICT, WITHOUT ROWID;
INSERT INTO fence_history_lean (entity, fence, at, caller, request_id)
  SELECT entity, fence, at, caller, request_id FROM fence_history;
DROP TABLE fence_history;
ALTER TABLE fence_history_lean RENAME TO fence_history;

CREATE TABLE idempotency_records_lean (
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
  PRIMARY KEY (key, scope)
) STRICT;
INSERT INTO idempotency_records_lean
  (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, status, headers, body, created_at, expires_at)
  SELECT scope, key, fingerprint, entity, fence, state, owner_token, locked_until, status, headers, body, created_at, expires_at
  FROM idempotency_records;
DROP TABLE idempotency_records;
ALTER TABLE idempotency_records_lean RENAME TO idempotency_records;

-- The partial indexes of 0001 and 0004 went with the old table.
CREATE INDEX idempotency_records_expiry
  ON idempotency_records (expires_at) WHERE state = 'completed';
CREATE INDEX idempotency_records_locked
  ON idempotency_records (locked_until) WHERE state = 'in_progress';
CREATE INDEX idempotency_records_unknown
  ON idempotency_records (created_at) WHERE state = 'outcome_unknown';
