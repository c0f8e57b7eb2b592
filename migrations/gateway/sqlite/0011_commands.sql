-- fencegate gateway, SQLite and D1: the command log (DESIGN §4.1 `commands`),
-- one row per outcome of a request the gateway decided on: an admitted
-- request's finish (written in the finish's transaction), and the transient
-- refusals that have no finish (entity-busy, idempotency-in-progress,
-- payload-too-large). Ids, hashes and bounded text, never bodies, tokens or
-- query strings. Swept by `commandRetention` (DESIGN §4.4).
CREATE TABLE IF NOT EXISTS commands (
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

-- The sweeper (by age), an entity's story and a key's attempts (newest first).
CREATE INDEX IF NOT EXISTS commands_at ON commands (at);
CREATE INDEX IF NOT EXISTS commands_entity ON commands (entity, id);
CREATE INDEX IF NOT EXISTS commands_key ON commands (idempotency_key, id);
